"""Tiny random models: pagedserve's logits equal transformers' fp32 logits on the same weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bench.common.tiny_models import write_gguf_llama, write_gguf_model, write_hf_model
from pagedserve.core.attention.reference import TorchReferenceBackend
from pagedserve.core.models import load_model
from pagedserve.core.models.resolve import ResolvedModel, resolve_model
from tests.core.models.paged_driver import PagedBatch

PROMPT = [3, 17, 42, 99, 7, 250, 11, 64, 128, 5, 77, 31]
LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8,
}


def load(resolved: ResolvedModel, dtype: torch.dtype = torch.float32, attention=None):
    return load_model(
        resolved,
        dtype=dtype,
        device=torch.device("cpu"),
        attention=attention or TorchReferenceBackend(),
        progress=False,
    )


def hf_logits(hf_model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(torch.tensor([ids])).logits[0].float()


def paged_logits(model, arch, ids: list[int], num_decode: int = 4) -> torch.Tensor:
    """Prefill all but the last num_decode ids, then feed those one per step."""
    batch = PagedBatch(model, arch)
    split = len(ids) - num_decode
    rows = [batch.step([ids[:split]])] + [batch.step([[t]]) for t in ids[split:]]
    return torch.cat(rows)


def transformers_model(resolved: ResolvedModel):
    from transformers import AutoModelForCausalLM

    if resolved.format == "gguf":
        return AutoModelForCausalLM.from_pretrained(
            resolved.path.parent, gguf_file=resolved.path.name, dtype=torch.float32
        ).eval()
    return AutoModelForCausalLM.from_pretrained(resolved.path, dtype=torch.float32).eval()


def assert_matches_transformers(resolved: ResolvedModel, atol: float = 1e-4) -> None:
    model, arch = load(resolved)
    expected = hf_logits(transformers_model(resolved), PROMPT)
    got = paged_logits(model, arch, PROMPT)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, expected, atol=atol, rtol=1e-4)
    assert torch.equal(got.argmax(-1), expected.argmax(-1))


@pytest.mark.parametrize(
    "architecture,config",
    [
        ("llama", {}),  # GQA 4:2, untied
        ("llama", {"tie_word_embeddings": True, "num_key_value_heads": 4}),
        ("llama", {"rope_scaling": LLAMA3_SCALING}),
        ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
        ("qwen2", {}),  # q/k/v bias
    ],
    ids=["llama-gqa", "llama-tied-mha", "llama3-rope", "linear-rope", "qwen2-bias"],
)
def test_hf_folder_matches_transformers(tmp_path: Path, architecture: str, config: dict) -> None:
    folder = write_hf_model(tmp_path / "m", architecture, seed=1, **config)
    resolved = resolve_model(str(folder))
    assert resolved.format == "hf"
    assert_matches_transformers(resolved)


@pytest.mark.parametrize("qtype", ["F32", "Q8_0"])
@pytest.mark.parametrize("tie", [False, True])
def test_gguf_matches_transformers(tmp_path: Path, qtype: str, tie: bool) -> None:
    path = tmp_path / f"tiny-{qtype}.gguf"
    write_gguf_llama(path, qtype=qtype, seed=2, tie=tie)
    resolved = resolve_model(str(path))
    model, arch = load(resolved)
    assert arch.tie_word_embeddings == tie
    assert_matches_transformers(resolved)


def test_qwen2_gguf_with_bias_matches_transformers(tmp_path: Path) -> None:
    path = tmp_path / "qwen2.gguf"
    write_gguf_model(path, "qwen2", qtype="Q8_0", seed=7)
    resolved = resolve_model(str(path))
    _, arch = load(resolved)
    assert (arch.architecture, arch.attention_bias) == ("qwen2", True)
    assert_matches_transformers(resolved)


def test_gguf_f32_equals_its_source_model(tmp_path: Path) -> None:
    """Without quantization the GGUF holds the source weights exactly: if the Q/K inverse
    permutation were wrong, the logits would differ from the model the file was written from."""
    path = tmp_path / "tiny.gguf"
    source = write_gguf_llama(path, qtype="F32", seed=3)
    model, arch = load(resolve_model(str(path)))
    torch.testing.assert_close(paged_logits(model, arch, PROMPT), hf_logits(source, PROMPT))


def test_mixed_batch_equals_separate_requests(tmp_path: Path) -> None:
    """A prefill and a decode in one flat batch give the same logits as run alone."""
    hf = write_hf_model(tmp_path / "m", "llama", seed=4)
    model, arch = load(resolve_model(str(hf)))
    alone_a = paged_logits(model, arch, PROMPT[:6], num_decode=1)
    alone_b = paged_logits(model, arch, PROMPT[3:], num_decode=0)
    batch = PagedBatch(model, arch, num_reqs=2)
    first = batch.step([PROMPT[:5], PROMPT[3:6]])  # both prefill
    second = batch.step([[PROMPT[5]], PROMPT[6:]])  # a decode next to a prefill chunk
    torch.testing.assert_close(torch.cat([first[:5], second[:1]]), alone_a)
    torch.testing.assert_close(torch.cat([first[5:], second[1:]]), alone_b)


def test_bf16_close_to_fp32(tmp_path: Path) -> None:
    folder = write_hf_model(tmp_path / "m", "llama", seed=5)
    resolved = resolve_model(str(folder))
    model32, arch = load(resolved)
    model16, _ = load(resolved, torch.bfloat16)
    assert model16.embed_tokens.weight.dtype == torch.bfloat16
    lm_head = (
        model16.lm_head.packed if model16.lm_head.packed is not None else model16.lm_head.weight
    )
    assert lm_head.dtype == torch.bfloat16  # packed where the native kernel applies
    ref = paged_logits(model32, arch, PROMPT)
    got = PagedBatch(model16, arch, dtype=torch.bfloat16).step([PROMPT])
    assert got.dtype == torch.float32
    assert (got - ref).abs().max() < 0.1 * ref.abs().max()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_attention_backend_matches_reference(tmp_path: Path, dtype: torch.dtype) -> None:
    """The model's strided q/k/v views go through the native kernels unchanged."""
    from pagedserve.core.attention.native import NativeAttentionBackend

    resolved = resolve_model(str(write_hf_model(tmp_path / "m", "qwen2", seed=6)))
    results = []
    for backend in (TorchReferenceBackend(), NativeAttentionBackend()):
        model, arch = load(resolved, dtype, attention=backend)
        batch = PagedBatch(model, arch, num_reqs=2, dtype=dtype)
        rows = [batch.step([PROMPT[:7], PROMPT[2:5]]), batch.step([[PROMPT[7]], PROMPT[5:]])]
        results.append(torch.cat(rows))
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(results[1], results[0], atol=tol, rtol=tol)
