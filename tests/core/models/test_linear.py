"""models.linear.Linear: the packed native bf16 / fp32 paths against torch's expressions they
replace (and a float64 reference), at every ISA level with a path (avx2: AVX2 FMAs, bf16
widened; avx512_bf16: AVX512-BF16 dot products; levels the CPU lacks skip, saying so); the fp32
AVX2 path's bits against the AVX-512 one's; and the torch path where the kernel does not apply."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pagedserve.core.models.linear.dense import GateUpLinear, Linear
from pagedserve.core.ops import layer_ops
from pagedserve.core.ops.cpu_features import forced_cpu_isa, runnable_isas
from pagedserve.core.ops.linear import (
    native_linear_available,
    native_linear_path,
    pack_gated_weight,
    pack_weight,
    packed_gated_linear,
    packed_linear,
)

NATIVE_ISAS = ("avx2", "avx512_bf16")
"""A level per path of the native kernels (avx2_vnni and avx512 run avx2's)."""
each_native_path = pytest.mark.parametrize("cpu_isa", NATIVE_ISAS, indirect=True)


def make(k: int, n: int, bias: bool, dtype: torch.dtype, seed: int = 0) -> Linear:
    gen = torch.Generator().manual_seed(seed)
    layer = Linear(k, n, bias=bias)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(n, k, generator=gen) * k**-0.5)  # type: ignore[union-attr]
        if layer.bias is not None:
            layer.bias.copy_(torch.randn(n, generator=gen))
    return layer.to(dtype).requires_grad_(False)


def reference(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, residual: torch.Tensor | None
) -> torch.Tensor:
    """fp32 math on the same bf16 inputs, rounded once at the end by the caller."""
    y = x.float() @ w.float().t()
    if b is not None:
        y = y + b.float()
    return y if residual is None else y + residual.float()


@each_native_path
@pytest.mark.parametrize("m", [1, 7, 8, 9, 64, 300])
@pytest.mark.parametrize(("k", "n"), [(576, 960), (33, 70), (1536, 576), (5, 1)])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_matches_fp32_math_rounded_once(
    m: int, k: int, n: int, bias: bool, cpu_isa: str
) -> None:
    layer = make(k, n, bias, torch.bfloat16)
    w = layer.weight.clone()  # type: ignore[union-attr]
    b = None if layer.bias is None else layer.bias.clone()
    assert layer.pack() and layer.weight is None and layer.packed is not None
    x = torch.randn(m, k).to(torch.bfloat16)
    residual = torch.randn(m, n).to(torch.bfloat16)
    want = reference(x, w, b, None)
    torch.testing.assert_close(layer(x), want.to(torch.bfloat16), rtol=8e-3, atol=2e-3)
    torch.testing.assert_close(layer(x, out_dtype=torch.float32), want, rtol=1e-4, atol=1e-4)
    want_res = reference(x, w, b, residual).to(torch.bfloat16)
    torch.testing.assert_close(layer(x, residual), want_res, rtol=8e-3, atol=2e-3)


@each_native_path
def test_packed_close_to_torch_bf16_linear(cpu_isa: str) -> None:
    """The expressions llama.py used before: F.linear and addmm in bf16."""
    layer = make(576, 960, False, torch.bfloat16, seed=3)
    w = layer.weight.clone()  # type: ignore[union-attr]
    layer.pack()
    x, h = torch.randn(64, 576).to(torch.bfloat16), torch.randn(64, 960).to(torch.bfloat16)
    torch.testing.assert_close(layer(x), F.linear(x, w), rtol=1.6e-2, atol=1e-2)
    torch.testing.assert_close(layer(x, h), torch.addmm(h, x, w.t()), rtol=1.6e-2, atol=1e-2)


@each_native_path
def test_packed_takes_strided_views(cpu_isa: str) -> None:
    layer = make(64, 48, True, torch.bfloat16, seed=4)
    w, b = layer.weight.clone(), layer.bias.clone()  # type: ignore[union-attr]
    layer.pack()
    wide = torch.randn(10, 100).to(torch.bfloat16)
    x = wide[:, 10:74]  # rows 100 apart
    torch.testing.assert_close(
        layer(x, out_dtype=torch.float32), reference(x, w, b, None), rtol=1e-4, atol=1e-4
    )
    xt = torch.randn(64, 10).to(torch.bfloat16).t()  # not contiguous in its last dim
    torch.testing.assert_close(
        layer(xt, out_dtype=torch.float32), reference(xt, w, b, None), rtol=1e-4, atol=1e-4
    )


@each_native_path
def test_packed_refuses_bad_inputs(cpu_isa: str) -> None:
    layer = make(16, 8, False, torch.bfloat16)
    layer.pack()
    with pytest.raises(ValueError, match="features"):
        layer(torch.zeros(2, 15, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="bfloat16"):
        layer(torch.zeros(2, 16))
    with pytest.raises(ValueError, match="residual"):
        layer(torch.zeros(2, 16, dtype=torch.bfloat16), torch.zeros(2, 9, dtype=torch.bfloat16))


@pytest.mark.parametrize("dtype", [torch.float16])
def test_other_dtypes_stay_on_torch_bit_for_bit(dtype: torch.dtype) -> None:
    layer = make(40, 24, True, dtype, seed=5)
    assert not layer.pack() and layer.packed is None
    x, h = torch.randn(6, 40).to(dtype), torch.randn(6, 24).to(dtype)
    w, b = layer.weight, layer.bias
    assert torch.equal(layer(x), F.linear(x, w, b))  # type: ignore[arg-type]
    assert torch.equal(layer(x, h), F.linear(x, w, b) + h)  # type: ignore[arg-type]
    nobias = make(40, 24, False, dtype, seed=6)
    assert torch.equal(nobias(x, h), torch.addmm(h, x, nobias.weight.t()))  # type: ignore[union-attr]


@each_native_path
@pytest.mark.parametrize("m", [1, 9, 300])
@pytest.mark.parametrize(("k", "n"), [(576, 960), (33, 70), (5, 1)])
def test_float32_packs_and_matches_float64_math(m: int, k: int, n: int, cpu_isa: str) -> None:
    """fp32 weights take the native fp32 kernel (batch-invariant, unlike torch's matmul)."""
    layer = make(k, n, True, torch.float32, seed=4)
    w, b = layer.weight.double(), layer.bias.double()  # type: ignore[union-attr]
    assert layer.pack() and layer.packed is not None and layer.packed.dtype == torch.float32
    x, h = torch.randn(m, k), torch.randn(m, n)
    want = x.double() @ w.t() + b
    torch.testing.assert_close(layer(x), want.float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(layer(x, h), (want + h.double()).float(), rtol=1e-5, atol=1e-5)
    out = torch.empty(m, n)
    torch.library.opcheck(packed_linear.op, (out, x, layer.packed, layer.bias, h))
    gated = make_gate_up(k, 24, torch.float32, seed=5)
    want = layer_ops.silu_and_mul(F.linear(x.double(), gated.weight.double()))  # type: ignore[arg-type]
    assert gated.pack()
    torch.testing.assert_close(gated(x), want.float(), rtol=1e-5, atol=1e-5)


@each_native_path
def test_registered_op_passes_opcheck(cpu_isa: str) -> None:
    """The op torch.compile traces: schema, fake (meta) implementation, aliasing of `out`."""
    layer = make(40, 24, True, torch.bfloat16, seed=7)
    layer.pack()
    x, h = torch.randn(5, 40).to(torch.bfloat16), torch.randn(5, 24).to(torch.bfloat16)
    for out_dtype, residual in ((torch.bfloat16, h), (torch.float32, None)):
        out = torch.empty(5, 24, dtype=out_dtype)
        torch.library.opcheck(packed_linear.op, (out, x, layer.packed, layer.bias, residual))


def make_gate_up(k: int, width: int, dtype: torch.dtype, seed: int = 0) -> GateUpLinear:
    gen = torch.Generator().manual_seed(seed)
    layer = GateUpLinear(k, width)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(2 * width, k, generator=gen) * k**-0.5)  # type: ignore[union-attr]
    return layer.to(dtype).requires_grad_(False)


@each_native_path
@pytest.mark.parametrize("m", [1, 9, 64])
@pytest.mark.parametrize(("k", "width"), [(576, 1536), (33, 17), (64, 16), (8, 1), (40, 40)])
def test_gate_up_packed_matches_fp32_math_rounded_once(
    m: int, k: int, width: int, cpu_isa: str
) -> None:
    """silu(gate) * up on the fp32 accumulators, rounded once; widths off the 16-column blocks
    (padded with zero rows in the interleaved packing) too."""
    layer = make_gate_up(k, width, torch.bfloat16, seed=m + width)
    w = layer.weight.clone()  # type: ignore[union-attr]
    assert layer.pack() and layer.packed is not None
    x = (torch.randn(m, k) * 2).to(torch.bfloat16)
    y = x.float() @ w.float().t()
    want = F.silu(y[:, :width]) * y[:, width:]
    got = layer(x)
    assert got.shape == (m, width) and got.dtype == torch.bfloat16
    torch.testing.assert_close(got, want.to(torch.bfloat16), rtol=8e-3, atol=2e-3)


@each_native_path
def test_gate_up_packed_handles_extreme_gates(cpu_isa: str) -> None:
    """SiLU's exp over the whole float range: huge negative gates give -0, huge positive ones
    the product itself, NaN stays NaN."""
    layer = make_gate_up(2, 3, torch.bfloat16)
    with torch.no_grad():  # gate j = x0 * gate_w[j], up j = x1
        layer.weight.copy_(torch.tensor([[1e4, 0], [-1e4, 0], [1.0, 0], [0, 1], [0, 1], [0, 1]]))
    layer.pack()
    x = torch.tensor([[1.0, 2.0], [float("nan"), 1.0]], dtype=torch.bfloat16)
    out = layer(x).float()
    assert out[0, 0] == pytest.approx(2e4, rel=1e-2)  # silu(1e4) * 2
    assert out[0, 1] == 0  # silu(-1e4) * 2 = -1e4 / (1 + e^1e4)
    assert out[0, 2] == pytest.approx(2 * 0.7310586, rel=1e-2)
    assert torch.isnan(out[1]).all()


@pytest.mark.parametrize("dtype", [torch.float16])
def test_gate_up_other_dtypes_stay_on_torch_bit_for_bit(dtype: torch.dtype) -> None:
    layer = make_gate_up(40, 24, dtype, seed=8)
    assert not layer.pack()
    x = torch.randn(6, 40).to(dtype)
    want = layer_ops.silu_and_mul(F.linear(x, layer.weight))  # type: ignore[arg-type]
    assert torch.equal(layer(x), want)


@each_native_path
def test_gate_up_refuses_bad_inputs_and_passes_opcheck(cpu_isa: str) -> None:
    layer = make_gate_up(16, 20, torch.bfloat16, seed=9)
    layer.pack()
    with pytest.raises(ValueError, match="features"):
        layer(torch.zeros(2, 15, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="bfloat16"):
        layer(torch.zeros(2, 16))
    x = torch.randn(3, 16).to(torch.bfloat16)
    with pytest.raises(ValueError, match="packed"):
        packed_gated_linear(torch.empty(3, 37, dtype=torch.bfloat16), x, layer.packed)
    torch.library.opcheck(packed_gated_linear.op, (torch.empty(3, 20, dtype=torch.bfloat16), x,
                                                layer.packed))  # fmt: skip


def test_each_level_runs_its_path(cpu_isa: str) -> None:
    """avx2 and avx2_vnni run the AVX2 path, avx512 (no AVX512-BF16) its own, avx512_bf16 and amx
    the AVX512-BF16 one; portable packs nothing and runs torch's expressions."""
    want = {"portable": "none", "avx512": "avx512", "avx512_bf16": "avx512_bf16",
            "amx": "avx512_bf16"}  # fmt: skip
    assert native_linear_path() == want.get(cpu_isa, "avx2")
    layer = make(40, 24, True, torch.float32, seed=10)
    w, b = layer.weight.clone(), layer.bias.clone()  # type: ignore[union-attr]
    x = torch.randn(3, 40)
    assert layer.pack() == native_linear_available() == (cpu_isa != "portable")
    if cpu_isa == "portable":
        assert layer.packed is None and torch.equal(layer(x), F.linear(x, w, b))


def levels_with(*levels: str) -> list[str]:
    """Those of `levels` this CPU runs; the test skips, saying so, unless avx2 and one more are."""
    here = [level for level in levels if level in runnable_isas()]
    if "avx2" not in here or len(here) < 2:
        pytest.skip(f"this CPU runs {runnable_isas()}: not the AVX2 path and an AVX-512 one")
    return here


def bits(t: torch.Tensor) -> torch.Tensor:
    """t's bits as integers (NaN payloads compared too)."""
    return t.view(torch.int16 if t.dtype == torch.bfloat16 else torch.int32)


def test_float32_avx2_path_equals_avx512_bit_for_bit() -> None:
    """The fp32 AVX2 path gives the AVX-512 one's bits, at avx512 and avx512_bf16 alike (one FMA
    chain over k in order, the same epilogue): plain, bias and residual, gated (gates past exp's
    range), rows around the micro-tiles."""
    gen = torch.Generator().manual_seed(11)
    w, b = torch.randn(100, 577, generator=gen), torch.randn(100, generator=gen)
    packed, gated = pack_weight(w), pack_gated_weight(torch.randn(80, 577, generator=gen), 40)
    results = []
    for level in levels_with("avx2", "avx512", "avx512_bf16"):
        with forced_cpu_isa(level):
            outs = []
            for m in (1, 2, 6, 7, 300):
                x = torch.randn(m, 577, generator=torch.Generator().manual_seed(m))
                h = torch.randn(m, 100, generator=torch.Generator().manual_seed(m + 1))
                plain, fused, mlp = torch.empty(m, 100), torch.empty(m, 100), torch.empty(m, 40)
                packed_linear(plain, x, packed, None, None)
                packed_linear(fused, x, packed, b, h)
                packed_gated_linear(mlp, x * 8, gated)  # |gate| up to ~300
                outs += [plain, fused, mlp]
            results.append(outs)
    for avx2, *avx512 in zip(*results, strict=True):
        assert all(torch.equal(avx2, other) for other in avx512)


def test_bf16_avx512_path_equals_avx2_bit_for_bit() -> None:
    """The bf16 path at avx512 (no AVX512-BF16: bf16 widened by shifts, 16-lane FMA chains) gives
    the AVX2 path's bits: bf16 and fp32 outputs, bias and residual, gated (gates past exp's
    range), an odd k, rows around both paths' micro-tiles, and rows that overflow to inf / NaN."""
    levels = levels_with("avx2", "avx512")
    gen = torch.Generator().manual_seed(13)
    w = torch.randn(100, 577, generator=gen).to(torch.bfloat16)
    b, packed = torch.randn(100, generator=gen).to(torch.bfloat16), pack_weight(w)
    gated = pack_gated_weight(torch.randn(80, 577, generator=gen).to(torch.bfloat16), 40)
    row_counts, results = (1, 2, 5, 7, 9, 300), []
    for level in levels:
        with forced_cpu_isa(level):
            outs = []
            for m in row_counts:
                g = torch.Generator().manual_seed(m)
                x = torch.randn(m, 577, generator=g)
                x[-1] *= 1e38 if m == 9 else 1  # inf in x, inf and NaN sums
                x, h = x.to(torch.bfloat16), torch.randn(m, 100, generator=g).to(torch.bfloat16)
                plain, logits = torch.empty(m, 100, dtype=torch.bfloat16), torch.empty(m, 100)
                fused, mlp = torch.empty_like(plain), torch.empty(m, 40, dtype=torch.bfloat16)
                packed_linear(plain, x, packed, None, None)
                packed_linear(logits, x, packed, None, None)
                packed_linear(fused, x, packed, b, h)
                packed_gated_linear(mlp, x * 8, gated)
                outs += [plain, logits, fused, mlp]
            results.append(outs)
    m9_logits = results[1][4 * row_counts.index(9) + 1]  # outs: 4 per row count
    assert not m9_logits[-1].isfinite().any()  # the overflowing row
    for avx2, avx512 in zip(*results, strict=True):
        assert torch.equal(bits(avx2), bits(avx512))


def test_bf16_paths_round_their_own_way_both_close() -> None:
    """Each level runs its own bf16 path: VDPBF16PS adds a pair's products odd feature first, the
    AVX2 and avx512 paths even first, so some fp32 outputs differ in their last bits (were one level to run
    the other's path, none would), and both stay within fp32 reordering of a float64 sum."""
    if "avx512_bf16" not in runnable_isas():
        pytest.skip(f"this CPU runs {runnable_isas()}: not the AVX512-BF16 path")
    gen = torch.Generator().manual_seed(12)
    x = torch.randn(16, 576, generator=gen).to(torch.bfloat16)
    w = torch.randn(256, 576, generator=gen).to(torch.bfloat16)
    packed, want = pack_weight(w), x.double() @ w.double().t()
    outs = {}
    for level in ("avx2", "avx512", "avx512_bf16"):
        with forced_cpu_isa(level):
            outs[level] = torch.empty(16, 256)
            packed_linear(outs[level], x, packed, None, None)
            torch.testing.assert_close(outs[level].double(), want, rtol=1e-5, atol=1e-4)
    assert not torch.equal(outs["avx2"], outs["avx512_bf16"])
    assert torch.equal(outs["avx2"], outs["avx512"])  # avx512 widens pairs as AVX2 does
