"""tokenizer.ggml.pre names the split a GGUF's BPE merges were learned with: a known one is
used, an unknown one is refused at load with an error naming it (never GPT-2's split instead)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.common.tiny_models import write_gguf_model
from pagedserve import LLM
from pagedserve.core.tokenizers.gguf_vocab import gguf_tokenizer

TEXT = "Hello  world 12345 it's"


@pytest.mark.parametrize("pre", [None, "default", "gpt2", "smollm", "llama-bpe", "qwen2"])
def test_known_pre_tokenizers_load(tmp_path: Path, pre: str | None) -> None:
    path = tmp_path / "tiny.gguf"
    write_gguf_model(path, pre=pre)
    tokenizer = gguf_tokenizer(path)
    assert tokenizer.decode(tokenizer.encode(TEXT, add_special_tokens=False)) == TEXT


def test_split_follows_the_pre_tokenizer(tmp_path: Path) -> None:
    """The same merges, three splits: GPT-2 keeps " 1000" whole, llama-bpe cuts the space off
    and the digits in threes, qwen2 cuts every digit: three different token lists."""
    ids = []
    for pre in ("gpt2", "llama-bpe", "qwen2"):
        write_gguf_model(tmp_path / f"{pre}.gguf", pre=pre)
        ids.append(tuple(gguf_tokenizer(tmp_path / f"{pre}.gguf").encode("x 1000", False)))
    assert len(set(ids)) == 3, ids


def test_unknown_pre_tokenizer_is_refused_at_load(tmp_path: Path) -> None:
    path = tmp_path / "tiny.gguf"
    write_gguf_model(path, pre="deepseek-llm")
    with pytest.raises(ValueError, match=r"tokenizer\.ggml\.pre: 'deepseek-llm' is not"):
        gguf_tokenizer(path)
    with pytest.raises(ValueError, match="deepseek-llm"):
        LLM(str(path), dtype="float32", num_pages=16)
