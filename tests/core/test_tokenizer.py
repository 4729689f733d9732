"""Token ids (and decoded text) must equal transformers' for the same files."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from bench.common.tiny_tokenizers import (
    TRICKY_TEXTS,
    default_gguf_path,
    write_tiny_bpe,
    write_tiny_spm,
)
from pagedserve.core.tokenizers.load import Tokenizer, load_tokenizer
from pagedserve.core.tokenizers.spm import SentencePieceTokenizer

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module", params=["gguf", "bpe", "spm"])
def pair(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Tokenizer, object]:
    kind = str(request.param)
    if kind == "gguf":
        return load_tokenizer(default_gguf_path()), request.getfixturevalue("hf_default_tokenizer")
    tmp = tmp_path_factory.mktemp(kind)
    folder = write_tiny_bpe(tmp / "bpe") if kind == "bpe" else write_tiny_spm(tmp / "spm")
    return load_tokenizer(folder), transformers.AutoTokenizer.from_pretrained(folder)


@pytest.mark.parametrize("text", TRICKY_TEXTS)
def test_encode_matches_transformers(pair, text: str) -> None:
    ours, theirs = pair
    assert ours.encode(text) == theirs.encode(text)
    assert ours.encode(text, add_special_tokens=False) == theirs.encode(
        text, add_special_tokens=False
    )


def test_decode_matches_transformers(pair) -> None:
    ours, theirs = pair
    for text in TRICKY_TEXTS:
        ids = theirs.encode(text)
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(
                ids, skip_special_tokens=skip
            ), (text, skip)


def test_random_text_matches_transformers(pair) -> None:
    ours, theirs = pair
    rng = random.Random(0)
    alphabet = "ab c\n\t  1 2\u00e9\u4f60\U0001f600<>|_s/"
    for _ in range(200):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 30)))
        assert ours.encode(text) == theirs.encode(text), repr(text)


def test_special_tokens_and_metadata(pair) -> None:
    ours, theirs = pair
    assert ours.vocab_size == len(theirs)
    assert ours.bos_token == theirs.bos_token
    assert ours.eos_token == theirs.eos_token
    assert ours.bos_token_id == theirs.bos_token_id
    assert theirs.eos_token_id in ours.eos_token_ids
    assert ours.chat_template == theirs.chat_template
    assert ours.add_bos_token == (ours.encode("x")[:1] == [ours.bos_token_id])
    for token_id in theirs.all_special_ids:
        assert ours.is_special(token_id)
    assert not ours.is_special(ours.encode("hello", add_special_tokens=False)[0])


def test_token_bytes_rebuild_text(pair) -> None:
    ours, _ = pair
    for text in TRICKY_TEXTS:
        ids = ours.encode(text, add_special_tokens=False)
        raw = b"".join(ours.token_bytes(i) for i in ids)
        decoded = raw.decode("utf-8")
        if isinstance(ours, SentencePieceTokenizer):
            # `▁` is a space to sentencepiece, and its dummy prefix a space the text never had.
            decoded, text = (s.replace("\u2581", " ").removeprefix(" ") for s in (decoded, text))
        assert decoded == text


def test_token_str_is_printable_or_bytes(pair) -> None:
    ours, _ = pair
    ids = ours.encode("\u4f60\U0001f600", add_special_tokens=False)
    strings = [ours.token_str(i) for i in ids]
    for token_id, s in zip(ids, strings, strict=True):
        raw = ours.token_bytes(token_id)
        try:
            assert s == raw.decode("utf-8")
        except UnicodeDecodeError:
            assert s == "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


def test_token_bytes_rejects_unknown_ids(pair) -> None:
    ours, _ = pair
    with pytest.raises(ValueError, match="token_id"):
        ours.token_bytes(ours.vocab_size)


def test_default_model_ends_on_im_end() -> None:
    tokenizer = load_tokenizer(default_gguf_path())
    assert tokenizer.eos_token == "<|im_end|>"
    assert 2 in tokenizer.eos_token_ids
    assert tokenizer.chat_template is not None and "<|im_start|>" in tokenizer.chat_template


def test_generation_config_adds_eos_ids(tmp_path: Path) -> None:
    tokenizer = load_tokenizer(write_tiny_bpe(tmp_path))
    assert tokenizer.eos_token_ids == frozenset({0, 2})


def test_missing_tokenizer_files_name_the_model(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="model"):
        load_tokenizer(tmp_path)
