"""A GGUF `llama` (sentencepiece) vocabulary, rebuilt as a ModelProto, against transformers."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.common.tiny_tokenizers import TRICKY_TEXTS, write_tiny_spm_gguf
from pagedserve.core.tokenizers.load import load_tokenizer
from pagedserve.core.tokenizers.spm import SentencePieceTokenizer

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory):
    path = write_tiny_spm_gguf(tmp_path_factory.mktemp("spm_gguf") / "tiny.gguf")
    theirs = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    return load_tokenizer(path), theirs


def test_builds_a_sentencepiece_tokenizer(pair) -> None:
    ours, theirs = pair
    assert isinstance(ours, SentencePieceTokenizer)
    assert ours.vocab_size == len(theirs) == 500
    assert ours.add_bos_token and ours.bos_token == "<s>" and ours.eos_token_ids == {2}


@pytest.mark.parametrize("text", TRICKY_TEXTS)
def test_ids_and_text_match_transformers(pair, text: str) -> None:
    ours, theirs = pair
    ids = theirs.encode(text)
    assert ours.encode(text) == ids
    assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True)


def test_folder_with_one_gguf_reads_it(tmp_path: Path) -> None:
    write_tiny_spm_gguf(tmp_path / "model.gguf")
    assert load_tokenizer(tmp_path).encode("Hello", add_special_tokens=False)
