"""The vocabulary xgrammar sees is the one our tokenizers decode (BPE and SentencePiece, HF
folders and GGUF): a random walk through a grammar's allowed tokens spells text the grammar
accepts, and only end-of-sequence ids can end it."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
import torch

from bench.common.tiny_tokenizers import write_tiny_bpe, write_tiny_spm, write_tiny_spm_gguf
from pagedserve.core.sampling_params import StructuredOutputs
from pagedserve.core.structured import GrammarCache, GrammarState
from pagedserve.core.structured.bitmask import GrammarMasker
from pagedserve.core.tokenizers.load import load_tokenizer

WORDS = r"[a-z]{1,8}( [a-z]{1,8}){0,3}\."
GRAMMARS = [
    (StructuredOutputs("regex", WORDS), WORDS),
    (StructuredOutputs("choice", json.dumps(["hello world", "good bye"])), r"hello world|good bye"),
]


@pytest.fixture(scope="module", params=["hf-bpe", "hf-spm", "gguf-spm"])
def tokenizer(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp(request.param)
    if request.param == "hf-bpe":
        return load_tokenizer(write_tiny_bpe(folder))
    if request.param == "hf-spm":
        return load_tokenizer(write_tiny_spm(folder))
    return load_tokenizer(write_tiny_spm_gguf(Path(folder) / "vocab.gguf"))


@pytest.mark.parametrize("spec,pattern", GRAMMARS, ids=["regex", "choice"])
def test_random_walks_spell_accepted_text(tokenizer, spec, pattern: str) -> None:
    compiled = GrammarCache(tokenizer).compile(spec)
    masker, rng = GrammarMasker(), random.Random(0)
    for walk in range(5):
        state, spelled = GrammarState(compiled), b""
        for _ in range(60):
            logits = torch.zeros(1, tokenizer.vocab_size)
            masker.apply(logits, [0], [state])
            allowed = torch.isfinite(logits[0]).nonzero()[:, 0].tolist()
            assert allowed, f"walk {walk}: no token allowed after {spelled!r}"
            token = rng.choice(allowed)
            if token in tokenizer.eos_token_ids:
                break
            assert not tokenizer.is_special(token)
            spelled += tokenizer.token_bytes(token)
            assert not state.advance(token)
        else:
            pytest.fail(f"walk {walk} never ended: {spelled!r}")
        assert re.fullmatch(pattern, spelled.decode()), spelled
