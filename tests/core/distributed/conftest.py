"""Tiny random models for the tensor-parallel tests: every size they split divides by 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.common.tiny_models import write_hf_model
from bench.common.tiny_tokenizers import write_tiny_bpe


def write_tp_model(folder: Path, architecture: str = "llama") -> Path:
    """An HF folder (BPE tokenizer + safetensors) with 4 query / 2 KV heads, even widths and an
    even vocabulary, so that tensor_parallel_size 2 divides every size it splits."""
    from transformers import AutoTokenizer

    write_tiny_bpe(folder)
    vocab_size = len(AutoTokenizer.from_pretrained(folder))
    assert vocab_size % 2 == 0  # the engine samples over the tokenizer's vocabulary
    write_hf_model(folder, architecture, seed=3, vocab_size=vocab_size)
    return folder


@pytest.fixture(scope="session")
def tp_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tp_model(tmp_path_factory.mktemp("tp") / "llama")
