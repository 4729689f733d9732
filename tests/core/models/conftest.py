"""Fixtures the model tests share."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.common.tiny_models import write_hf_model
from bench.common.tiny_tokenizers import write_tiny_bpe


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama (tests/tiny_models.py) with a tiny BPE tokenizer, once per module."""
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("tiny-llama") / "model"
    write_tiny_bpe(folder)
    write_hf_model(folder, "llama", seed=3, vocab_size=len(AutoTokenizer.from_pretrained(folder)))
    return folder
