"""GGUF weights kept quantized in the model (models/linear/quantized.py, --quantization auto): which
layers are swapped, that the loaded model computes what the dequantized one does within the
int8 activations' rounding, tied embeddings, biases, fused parts of mixed types, and the
fallback (with a log line naming the type) where no kernel exists."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from torch import nn

from bench.common.tiny_models import write_gguf_model
from pagedserve.core.attention.native import NativeAttentionBackend
from pagedserve.core.attention.reference import TorchReferenceBackend
from pagedserve.core.models import load_model
from pagedserve.core.models.linear.dense import Linear
from pagedserve.core.models.linear.quantized import (
    KeptTensor,
    QuantizedGateUpLinear,
    QuantizedLinear,
    QuantizedPlan,
    plan_quantized,
)
from pagedserve.core.models.loader_gguf import open_gguf
from pagedserve.core.models.quantized_embedding import QuantizedEmbedding
from pagedserve.core.models.resolve import resolve_model
from pagedserve.core.ops.linear import native_linear_available
from pagedserve.core.ops.linear_quant import quant_linear_path, quant_linear_path_for
from tests.core.models.paged_driver import PagedBatch
from tests.core.models.test_decoder_stack import hidden_states
from tests.quant_blocks import dequantized, gguf_rows, int8_activations

IDS = [5, 17, 42, 7, 99, 3, 250, 11]


def load(path: Path, quantization: str, dtype: torch.dtype = torch.float32, attention=None):
    return load_model(resolve_model(str(path)), dtype=dtype, device=torch.device("cpu"),
                      attention=attention or TorchReferenceBackend(), progress=False,
                      quantization=quantization)  # fmt: skip


def logits(model, arch, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    batch = PagedBatch(model, arch, dtype=dtype)
    return torch.cat([batch.step([IDS[:5]])] + [batch.step([[t]]) for t in IDS[5:]])


@pytest.mark.parametrize(
    ("family", "qtype", "tie"),
    [("llama", "Q8_0", False), ("llama", "Q4_1", True), ("llama", "Q4_0", False),
     ("qwen2", "Q8_0", False),  # q/k/v biases on the quantized product
     ("qwen3", "Q8_0", False),  # q/k norms between the quantized products
     ("mixtral", "Q8_0", False)],  # experts stay dequantized, attention quantized
)  # fmt: skip
def test_linears_stay_quantized_and_match_the_dequantized_model(
    tmp_path: Path, family: str, qtype: str, tie: bool
) -> None:
    path = tmp_path / "m.gguf"
    write_gguf_model(path, family, qtype=qtype, tie=tie)
    model, arch = load(path, "auto")
    layer = model.layers[0]
    assert isinstance(layer.qkv_proj, QuantizedLinear) and isinstance(layer.o_proj, QuantizedLinear)
    if family == "mixtral":
        assert not any(isinstance(m, QuantizedGateUpLinear) for m in model.modules())
    else:
        assert isinstance(layer.mlp.gate_up_proj, QuantizedGateUpLinear)
    assert isinstance(model.lm_head, QuantizedLinear)
    assert model.quantization.startswith(f"{qtype} x ") and "kept quantized" in model.quantization
    # Kept in its blocks: the LM head reads them (tied) or is a tensor of its own.
    assert isinstance(model.embed_tokens, QuantizedEmbedding)
    assert model.embed_tokens.ggml_type.name == qtype
    if family == "qwen2":
        assert layer.qkv_proj.bias is not None and layer.qkv_proj.bias.abs().sum() > 0
    want = logits(*load(path, "none"))
    got = logits(model, arch)
    # int8 activations (half a step per 32 features) through every layer of a random model:
    # measured up to 0.085 of the logits' spread; 0.15 states it with room.
    assert (got - want).abs().max() <= 0.15 * want.std(), (got - want).abs().max()
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.85


@pytest.mark.skipif(
    not native_linear_available(), reason="no native linear kernel below ISA level avx2"
)
@pytest.mark.parametrize(("family", "qtype"), [("llama", "Q4_1"), ("qwen2", "Q8_0")])
@pytest.mark.parametrize(
    ("dtype", "activations"),
    [(torch.bfloat16, "int8"), (torch.float32, "int8"), (torch.float32, "int16")],
)
def test_native_stack_runs_the_quantized_layers_bit_for_bit(
    tmp_path: Path, family: str, qtype: str, dtype: torch.dtype, activations: str
) -> None:
    """bf16, or fp32 (every projection kept quantized), with the native attention: the decoder
    stack calls the quantized kernel for every projection, with the per-layer path's results
    bit for bit; both near the dequantized model."""
    path = tmp_path / "m.gguf"
    write_gguf_model(path, family, qtype=qtype)
    model, arch = load(path, "auto", dtype, NativeAttentionBackend())
    model.use_quantized_activations(activations)
    assert model.stack is not None and model.stack.dtype == dtype
    fused = hidden_states(model, arch, dtype)
    model.stack = None
    by_layer = hidden_states(model, arch, dtype)
    for got, want in zip(fused, by_layer, strict=True):
        assert got.dtype == dtype and torch.equal(got, want)
    dense = hidden_states(*load(path, "none", dtype, NativeAttentionBackend()), dtype)
    for got, want in zip(fused, dense, strict=True):
        assert (got.float() - want.float()).abs().max() <= 0.3 * want.float().std()


def segmented_layer(
    k: int, widths: tuple[int, ...], types: tuple[Q, ...], *, bias: bool
) -> tuple[nn.Module, list[np.ndarray]]:
    """A module whose `proj` is one QuantizedLinear of parts of these types (random GGUF rows)."""
    rows = [gguf_rows(t, n, k, seed=i) for i, (t, n) in enumerate(zip(types, widths, strict=True))]
    parts = [KeptTensor(f"p{i}", int(t), r, np.arange(r.shape[0]), k)
             for i, (t, r) in enumerate(zip(types, rows, strict=True))]  # fmt: skip
    holder = nn.Module()
    holder.proj = Linear(k, sum(widths), bias=bias)
    QuantizedPlan(linears={"proj": parts}).install(holder)
    return holder, rows


def test_parts_of_mixed_types_run_as_column_segments() -> None:
    """A Q4_K_M-style fused q/k/v: Q4_1, Q8_0 and Q4_1 parts -> segments of one output."""
    k, widths, types = 96, (64, 32, 40), (Q.Q4_1, Q.Q8_0, Q.Q4_1)
    holder, rows = segmented_layer(k, widths, types, bias=True)
    layer = holder.proj
    assert isinstance(layer, QuantizedLinear)
    assert [(s.ggml_type, s.width) for s in layer.segments] == [(3, 64), (8, 32), (3, 40)]
    assert layer.bias is not None
    with torch.no_grad():
        layer.bias.copy_(torch.randn(sum(widths)))
    x, residual = torch.randn(5, k), torch.randn(5, sum(widths))
    got = layer(x, residual)
    w = np.concatenate([dequantized(r, t) for r, t in zip(rows, types, strict=True)])
    want = int8_activations(x.numpy()) @ w.T + layer.bias.numpy() + residual.numpy()
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)


def test_types_without_a_kernel_are_dequantized_and_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "m.gguf"
    write_gguf_model(path, "llama", qtype="Q5_0")
    with caplog.at_level(logging.WARNING):
        model, _ = load(path, "auto")
    assert "no kernel for Q5_0" in caplog.text
    assert not any(isinstance(m, QuantizedLinear) for m in model.modules())
    assert isinstance(model.layers[0].qkv_proj, Linear)


@pytest.mark.parametrize(
    ("family", "qtype", "every"),
    [("llama", "Q8_0", True), ("llama", "Q5_0", False), ("mixtral", "Q8_0", False)],
    ids=["llama-q8_0", "no-kernel-type", "experts"],
)
def test_every_linear_kept_only_when_no_linear_is_left_dense(
    tmp_path: Path, family: str, qtype: str, every: bool
) -> None:
    """What --dtype auto reads ahead on CPUs without AVX512-BF16 (startup.every_linear_quantized):
    a type without a kernel or experts (which no quantized kernel covers) leave linears dense."""
    path = tmp_path / "m.gguf"
    write_gguf_model(path, family, qtype=qtype)
    arch, reader = open_gguf(path)
    plan = plan_quantized(reader, arch, dtype=torch.float32, device=torch.device("cpu"), quiet=True)
    assert plan.every_linear_kept is every
    if family == "mixtral":
        assert plan.linears and "layers.0.mlp" in plan.dense  # attention kept, experts not


@pytest.mark.parametrize("kind", ["float", "int16"])
def test_activations_are_a_layer_attribute_each_forward_passes_on(kind: str) -> None:
    """use_activations("float") after load: x kept in fp32, so the segments compute x W^T of
    the dequantized weight up to fp32 sums (ops/linear_quant.py), not the int8 rounding;
    "int16": x rounded to 2^-15 of each block's largest value, ~256 times nearer than int8."""
    k, widths, types = 96, (64, 40), (Q.Q4_1, Q.Q8_0)
    holder, rows = segmented_layer(k, widths, types, bias=False)
    layer = holder.proj
    assert isinstance(layer, QuantizedLinear) and layer.float_activations is False
    x, residual = torch.randn(5, k) * 3, torch.randn(5, sum(widths))
    w = np.concatenate([dequantized(r, t) for r, t in zip(rows, types, strict=True)])
    exact = x.double().numpy() @ w.T.astype(np.float64) + residual.double().numpy()
    int8 = layer(x, residual).double().numpy()
    layer.use_activations(kind)
    assert (layer.float_activations, layer.int16_activations) == (kind == "float", kind == "int16")
    got = layer(x, residual).double().numpy()
    tol = 1e-5 if kind == "float" else 1e-3
    np.testing.assert_allclose(got, exact, rtol=tol, atol=tol)
    assert np.abs(got - exact).max() < 0.01 * np.abs(int8 - exact).max()

    gate, up = gguf_rows(Q.Q4_1, 40, k, 7), gguf_rows(Q.Q4_1, 40, k, 8)
    plan = QuantizedPlan(gated={"mlp": [KeptTensor("g", int(Q.Q4_1), gate, np.arange(40), k),
                                        KeptTensor("u", int(Q.Q4_1), up, np.arange(40), k)]})  # fmt: skip
    holder.mlp = nn.Linear(1, 1)
    plan.install(holder)
    mlp = holder.mlp
    assert isinstance(mlp, QuantizedGateUpLinear) and mlp.float_activations is False
    mlp.use_activations(kind)
    g = x.double().numpy() @ dequantized(gate, Q.Q4_1).T.astype(np.float64)
    u = x.double().numpy() @ dequantized(up, Q.Q4_1).T.astype(np.float64)
    np.testing.assert_allclose(mlp(x).double().numpy(), g / (1 + np.exp(-g)) * u, rtol=1e-4,
                               atol=1e-5 if kind == "float" else 1e-3)  # fmt: skip
    with pytest.raises(ValueError, match="activations must be one of"):
        layer.use_activations("int4")


@pytest.mark.parametrize("kind", ["int16", "float", "int8"])
def test_the_summary_names_the_path_the_activations_run(tmp_path: Path, kind: str) -> None:
    """model.quantization (the start-up line's and /v1/models' "weights") names the kernel path
    that runs: int16 rows take the AVX2 kernel on AVX-512 levels too, float rows their own."""
    path = tmp_path / "m.gguf"
    write_gguf_model(path, "llama", qtype="Q4_1")
    model, _ = load(path, "auto")
    assert f"kept quantized (native {quant_linear_path()})" in model.quantization
    model.use_quantized_activations(kind)
    assert f"kept quantized (native {quant_linear_path_for(kind)})" in model.quantization
    model.use_quantized_activations("int8")
    assert f"kept quantized (native {quant_linear_path()})" in model.quantization


@pytest.mark.parametrize(("kind", "tol"), [("float", 1e-4), ("int16", 1e-3)])
def test_float_and_int16_activations_bring_the_model_to_the_dequantized_ones_logits(
    tmp_path: Path, kind: str, tol: float
) -> None:
    """Every quantized layer of a tiny Q4_1 model with float (int16) activations: fp32 logits
    equal the dequantized model's up to fp32 summation order (and int16 rounding), far inside
    the int8 path's distance."""
    path = tmp_path / "m.gguf"
    write_gguf_model(path, "llama", qtype="Q4_1", tie=True)
    model, arch = load(path, "auto")
    want = logits(*load(path, "none"))
    int8 = logits(model, arch)
    layers = [m for m in model.modules() if isinstance(m, QuantizedLinear | QuantizedGateUpLinear)]
    assert layers
    for layer in layers:
        layer.use_activations(kind)
    got = logits(model, arch)
    assert (got - want).abs().max() <= tol * want.std(), (got - want).abs().max()
    assert (got - want).abs().max() < 0.05 * (int8 - want).abs().max()
