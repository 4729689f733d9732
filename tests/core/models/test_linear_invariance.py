"""Batch invariance of the model's linear layers (issue 16): the same input row gives a
bit-identical output in calls of 1, 7, 64 and 300 rows, on every path a model uses: the packed
bf16 kernel (bias, residual, fp32 logits, the gated product) and its fp32 twin, which the float32
model uses because torch's fp32 matmul is not batch-invariant (a row's result changed between
calls of 1 and 300 rows at these shapes). On each path: avx2 (AVX2 FMAs, bf16 widened, whose
micro-tiles are 5 and 6 rows, or whole tiles for 1-2) and avx512_bf16; a level the CPU lacks
skips, saying so."""

from __future__ import annotations

import pytest
import torch

from pagedserve.core.models.linear.dense import GateUpLinear, Linear
from pagedserve.core.ops.linear import native_linear_available

ROWS = (1, 2, 5, 7, 64, 300)
each_native_path = pytest.mark.parametrize("cpu_isa", ("avx2", "avx512_bf16"), indirect=True)
# SmolLM2-135M's products: qkv, o, down, and the lm_head's vocabulary (cut to keep it quick).
SHAPES = [(576, 960), (576, 576), (1536, 576), (576, 4099)]


def filled(layer: torch.nn.Module, seed: int) -> torch.nn.Module:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * p.shape[-1] ** -0.5)
    return layer.requires_grad_(False)


def packed(layer: torch.nn.Module, seed: int, dtype: torch.dtype) -> torch.nn.Module:
    """The layer with random weights in dtype, packed for the native kernel (bf16 or fp32)."""
    if not native_linear_available():
        pytest.skip("no native linear kernel at this level: torch's products are not invariant")
    layer = filled(layer, seed).to(dtype)
    assert layer.pack()
    return layer


def rows_in_calls(forward, x: torch.Tensor, residual: torch.Tensor | None) -> None:
    """forward's output for the first row of x is the same in calls of every size in ROWS, and
    so is the output for the last row of a 300-row call's slice at every offset; the 300-row
    call runs on 2 threads, the others on 1 (threads split columns, never k)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    full = forward(x, residual)
    torch.set_num_threads(1)
    try:
        for m in ROWS:
            for start in (0, 300 - m):
                part = None if residual is None else residual[start : start + m]
                got = forward(x[start : start + m], part)
                assert torch.equal(got, full[start : start + m]), (m, start)
    finally:
        torch.set_num_threads(threads)


@each_native_path
@pytest.mark.parametrize(("k", "n"), SHAPES)
@pytest.mark.parametrize("path", ["bf16", "bf16-bias-residual", "bf16-fp32-logits", "float32"])
def test_linear_rows_are_batch_invariant(k: int, n: int, path: str, cpu_isa: str) -> None:
    dtype = torch.float32 if path == "float32" else torch.bfloat16
    layer = packed(Linear(k, n, bias=path == "bf16-bias-residual"), k + n, dtype)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(300, k, generator=gen).to(dtype)
    residual = torch.randn(300, n, generator=gen).to(dtype) if "residual" in path else None
    out_dtype = torch.float32 if path == "bf16-fp32-logits" else None
    rows_in_calls(lambda a, r: layer(a, r, out_dtype=out_dtype), x, residual)


@each_native_path
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gated_rows_are_batch_invariant(dtype: torch.dtype, cpu_isa: str) -> None:
    layer = packed(GateUpLinear(576, 1536), 3, dtype)
    x = torch.randn(300, 576, generator=torch.Generator().manual_seed(2)).to(dtype)
    rows_in_calls(lambda a, _: layer(a), x, None)
