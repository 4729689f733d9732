"""Every family on tiny random checkpoints written by transformers (AutoConfig.for_model +
save_pretrained): logits per step and greedy tokens through the whole engine equal
transformers' in float32 (chunked prefill, a mixed batch, a prefix-cache hit, prompts shorter
and longer than the window), bf16 stays within a stated tolerance of fp32, and what we do not
implement is refused at load, naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bench.common.family_oracle import (
    CASES,
    LONGROPE,
    PROMPT,
    WINDOW_CASES,
    assert_engine_matches,
    load_hf,
)
from bench.common.tiny_models import write_hf_model
from bench.common.tiny_tokenizers import write_tiny_bpe
from pagedserve import LLM
from pagedserve.core.attention.native import NativeAttentionBackend
from pagedserve.core.attention.reference import TorchReferenceBackend
from pagedserve.core.models import load_model
from pagedserve.core.models.resolve import resolve_model
from tests.core.models.paged_driver import PagedBatch


def window_kernels() -> bool:
    import inspect

    return "sliding_window" in inspect.signature(NativeAttentionBackend.forward).parameters


needs_window = pytest.mark.skipif(not window_kernels(), reason="paged kernels lack the window")
ALL_CASES = [pytest.param(*v, id=k) for k, v in CASES.items()] + [
    pytest.param(*v, id=k, marks=needs_window) for k, v in WINDOW_CASES.items()
]


def load(folder: Path, dtype=torch.float32, attention=None, max_positions=None):
    return load_model(
        resolve_model(str(folder)),
        dtype=dtype,
        device=torch.device("cpu"),
        attention=attention or TorchReferenceBackend(),
        max_positions=max_positions,
        progress=False,
    )


def paged_logits(model, arch, ids, num_decode=4, dtype=torch.float32) -> torch.Tensor:
    batch = PagedBatch(model, arch, dtype=dtype)
    split = len(ids) - num_decode
    return torch.cat([batch.step([ids[:split]])] + [batch.step([[t]]) for t in ids[split:]])


@pytest.mark.parametrize(("family", "config"), ALL_CASES)
def test_logits_match_transformers(tmp_path: Path, family: str, config: dict) -> None:
    folder = write_hf_model(tmp_path / "m", family, seed=11, **config)
    model, arch = load(folder)
    with torch.no_grad():
        expected = load_hf(folder)(torch.tensor([PROMPT])).logits[0].float()
    got = paged_logits(model, arch, PROMPT)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


def test_longrope_long_factors_past_the_original_context(tmp_path: Path) -> None:
    """Served past the original context, longrope takes its long factors (llama.cpp's choice);
    transformers does the same for a sequence longer than the original context."""
    folder = write_hf_model(
        tmp_path / "m", "phi3", seed=12, rope_scaling=LONGROPE, original_max_position_embeddings=8
    )
    model, arch = load(folder, max_positions=64)
    with torch.no_grad():
        expected = load_hf(folder)(torch.tensor([PROMPT])).logits[0].float()
    got = PagedBatch(model, arch).step([PROMPT])
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    short, _ = load(folder, max_positions=8)
    assert not torch.allclose(short.rope_cos[:8], model.rope_cos[:8])


@pytest.mark.parametrize(("family", "config"), ALL_CASES)
def test_engine_greedy_matches_transformers(tmp_path: Path, family: str, config: dict) -> None:
    folder = tmp_path / "m"
    write_tiny_bpe(folder)
    write_hf_model(folder, family, seed=13, **config)
    # 8 tokens per step: chunked prefill; page_size 4: windows straddle pages.
    llm = LLM(str(folder), dtype="float32", num_pages=64, page_size=4, max_num_batched_tokens=8)
    assert_engine_matches(llm, load_hf(folder), PROMPT)


# Issue 24 saw these three disagree on other weights than seed 13's: more draws of each.
OTHER_WEIGHTS = [pytest.param(*WINDOW_CASES[k], seed, id=f"{k}-seed{seed}", marks=needs_window)
                 for k in ("gemma3", "qwen3-window", "mistral-window") for seed in (21, 22, 23)]  # fmt: skip


@pytest.mark.parametrize(("family", "config", "seed"), OTHER_WEIGHTS)
def test_engine_greedy_matches_transformers_other_weights(
    tmp_path: Path, family: str, config: dict, seed: int
) -> None:
    folder = tmp_path / "m"
    write_tiny_bpe(folder)
    write_hf_model(folder, family, seed=seed, **config)
    llm = LLM(str(folder), dtype="float32", num_pages=64, page_size=4, max_num_batched_tokens=8)
    assert_engine_matches(llm, load_hf(folder), PROMPT)


@pytest.mark.parametrize(("family", "config"), ALL_CASES)
def test_bf16_close_to_fp32(tmp_path: Path, family: str, config: dict) -> None:
    """bf16 on the native path (packed kernels, experts included, where the CPU has them):
    every step's logits within 5% of the fp32 logits' range."""
    folder = write_hf_model(tmp_path / "m", family, seed=14, **config)
    ref_model, arch = load(folder)
    model, _ = load(folder, torch.bfloat16, NativeAttentionBackend())
    ref = paged_logits(ref_model, arch, PROMPT)
    got = paged_logits(model, arch, PROMPT, dtype=torch.bfloat16)
    assert got.dtype == torch.float32
    assert (got - ref).abs().max() < 0.05 * ref.abs().max()
    if arch.architecture in ("qwen3", "qwen3_moe", "qwen2_moe", "mixtral", "gemma2", "gemma3_text"):
        assert model.stack is None  # layers unlike Llama's run one by one
