"""The quantized linear kernel (ops/linear_quant.py) against numpy oracles built from
gguf.quants' dequantization, over every type with a kernel and shapes around the tile edges
(odd row counts, columns not a multiple of 32, k not a multiple of 256 where the format allows).

Stated tolerances:
- against the exact int8 oracle (x rounded per 32 features as the kernel does, then an fp64
  product with the dequantized weight): 1e-5 of sum |xq| |w| (fp32 accumulation only);
- against dequantize-then-fp32 matmul of the unrounded x: half an int8 step per block,
  |y - x W^T| <= sum over blocks b of max|x_b| / 254 * sum_{i in b} |w_i| (+ 1e-5 relative);
  the same two with int16 rows (max|x_b| / 65024: int16_activations).
- float_activations (x kept in fp32) against the fp64 product of x with the dequantized weight
  (gguf.quants', in fp32): one fp32 FMA chain over k, |y - x W^T| <= (k + 4) 2^-24 sum |x| |w|
  (k roundings of the sum, a few ulp of w where gguf's fp32 dequantization rounds), plus half a
  bf16 ulp of |y| for bf16 outputs; gated: that error carried through silu(g) * u.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from pagedserve.core.models.linear.quantized import gated_row_table
from pagedserve.core.ops.cpu_features import CPU_ISAS, cpu_features, forced_cpu_isa, isa_at_least
from pagedserve.core.ops.linear_quant import (
    pack_quant_weight,
    quant_linear,
    quant_linear_float_path,
    quant_linear_path,
)
from pagedserve.core.ops.native import core
from tests.quant_blocks import TYPES, dequantized, gguf_rows, int8_activations, row_addresses

SMALL_SHAPES = [(1, 40, 96), (5, 96, 576), (17, 33, 64)]  # (m, n, k), 32-feature blocks
K_SHAPES = [(1, 40, 256), (5, 96, 512), (17, 33, 256)]  # 256-feature super-blocks


def shapes(qtype: Q) -> list[tuple[int, int, int]]:
    return K_SHAPES if qtype in (Q.Q4_K, Q.Q5_K, Q.Q6_K) else SMALL_SHAPES


CASES = [(t, s) for t in TYPES for s in shapes(t)]


def weight(qtype: Q, n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, np.ndarray]:
    rows = gguf_rows(qtype, n, k, seed)
    return pack_quant_weight(int(qtype), row_addresses(rows), k), dequantized(rows, qtype)


def product(qtype: Q, packed: torch.Tensor, x: torch.Tensor, n: int, **kw) -> torch.Tensor:
    out = kw.pop("out", None)
    if out is None:
        out = torch.empty(x.shape[0], n, dtype=kw.pop("out_dtype", x.dtype))
    quant_linear(out, x, packed, int(qtype), kw.get("bias"), kw.get("residual"), 0, 0, False,
                 kw.get("int16", False))  # fmt: skip
    return out


@pytest.mark.parametrize(("qtype", "shape"), CASES, ids=lambda v: getattr(v, "name", str(v)))
@pytest.mark.parametrize("qmax", [127, 32512], ids=["int8", "int16"])
@pytest.mark.parametrize("cpu_isa", CPU_ISAS, indirect=True)
def test_matches_the_int8_or_int16_oracle_and_the_fp32_dequantized_product(
    qtype: Q, shape: tuple[int, int, int], qmax: int, cpu_isa: str
) -> None:
    """int8 rows (127) or int16 rows (32512: int16_activations, test_linear_quant_int16.py)."""
    m, n, k = shape
    packed, w = weight(qtype, n, k, seed=m)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(n))
    got = product(qtype, packed, x, n, int16=qmax > 127).double().numpy()
    xq = int8_activations(x.numpy(), qmax)
    exact = xq @ w.T.astype(np.float64)
    assert np.all(np.abs(got - exact) <= 1e-5 * (np.abs(xq) @ np.abs(w.T)) + 1e-7)
    dense = x.double().numpy() @ w.T.astype(np.float64)
    amax = np.abs(x.numpy().reshape(m, -1, 32)).max(axis=-1)
    bound = np.repeat(amax / (2 * qmax), 32, axis=1) @ np.abs(w.T) * 1.0001
    assert np.all(np.abs(got - dense) <= bound + 1e-5 * (np.abs(x.numpy()) @ np.abs(w.T)))


@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q8_0, Q.Q6_K])
@pytest.mark.parametrize("qmax", [127, 32512], ids=["int8", "int16"])
@pytest.mark.parametrize("cpu_isa", CPU_ISAS, indirect=True)
def test_bf16_bias_in_place_residual_and_fp32_logits(qtype: Q, qmax: int, cpu_isa: str) -> None:
    m, n, k = shapes(qtype)[1]
    packed, w = weight(qtype, n, k)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(m, k, generator=gen).bfloat16()
    bias = torch.randn(n, generator=gen).bfloat16()
    out = torch.randn(m, n, generator=gen).bfloat16()
    start = out.double().numpy().copy()
    product(qtype, packed, x, n, out=out, bias=bias, residual=out, int16=qmax > 127)  # in place
    exact = int8_activations(x.float().numpy(), qmax) @ w.T.astype(np.float64)
    want = exact + bias.double().numpy() + start
    np.testing.assert_allclose(out.double().numpy(), want, rtol=2**-7, atol=1e-4)
    logits = product(qtype, packed, x, n, out_dtype=torch.float32, int16=qmax > 127)
    logits = logits.double().numpy()
    np.testing.assert_allclose(logits, exact, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q8_0, Q.Q4_K, Q.Q6_K])
@pytest.mark.parametrize("qmax", [127, 32512], ids=["int8", "int16"])
@pytest.mark.parametrize("cpu_isa", CPU_ISAS, indirect=True)
def test_gated_product_is_silu_gate_times_up(qtype: Q, qmax: int, cpu_isa: str) -> None:
    m, width, k = 9, 40, shapes(qtype)[0][2]
    gate, up = gguf_rows(qtype, width, k, 1), gguf_rows(qtype, width, k, 2)
    table = gated_row_table(row_addresses(gate), row_addresses(up), width)
    packed = pack_quant_weight(int(qtype), table, k)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(4))
    out = torch.empty(m, width)
    quant_linear(out, x, packed, int(qtype), None, None, width, 0, False, qmax > 127)
    xq = int8_activations(x.numpy(), qmax)
    wg, wu = dequantized(gate, qtype).T, dequantized(up, qtype).T
    g, u = xq @ wg, xq @ wu
    silu = g / (1 + np.exp(-g))
    # fp32 sums carry ~1e-7 of sum |xq| |w| each; silu' <= 1.1 carries the gate's to the output.
    tol = 2e-7 * (np.abs(xq) @ np.abs(wg) * np.abs(u) + np.abs(silu) * (np.abs(xq) @ np.abs(wu)))
    assert np.all(np.abs(out.numpy() - silu * u) <= tol + 1e-4 * np.abs(silu * u) + 1e-6)


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("kind", ["bf16", "fp32", "fp32-logits", "gated", "bias-residual"])
@pytest.mark.parametrize("cpu_isa", CPU_ISAS, indirect=True)
def test_every_isa_path_gives_the_portable_paths_bits(qtype: Q, kind: str, cpu_isa: str) -> None:
    """Same packed blocks, activations, fold and epilogue (SiLU and bf16 rounding included) on
    every path: the tokens cannot depend on the CPU."""
    m, n, k = shapes(qtype)[2]
    gen = torch.Generator().manual_seed(5)
    width = 0
    if kind == "gated":
        width = 40
        gate, up = gguf_rows(qtype, width, k, 1), gguf_rows(qtype, width, k, 2)
        packed = pack_quant_weight(int(qtype), gated_row_table(row_addresses(gate),
                                   row_addresses(up), width), k)  # fmt: skip
        n = width
    else:
        packed, _ = weight(qtype, n, k)
    x = torch.randn(m, k, generator=gen) * 3
    x = x if kind == "fp32" else x.bfloat16()
    bias = torch.randn(n, generator=gen).to(x.dtype) if kind == "bias-residual" else None
    residual = torch.randn(m, n, generator=gen).to(x.dtype) if kind == "bias-residual" else None
    out_dtype = torch.float32 if kind == "fp32-logits" else x.dtype

    def run() -> torch.Tensor:
        out = torch.empty(m, n, dtype=out_dtype)
        quant_linear(out, x, packed, int(qtype), bias, residual, width)
        return out

    got = run()
    with forced_cpu_isa("portable"):
        want = run()
    assert torch.equal(got.view(torch.int16 if got.dtype == torch.bfloat16 else torch.int32),
                       want.view(torch.int16 if want.dtype == torch.bfloat16 else torch.int32))  # fmt: skip


@pytest.mark.parametrize("cpu_isa", CPU_ISAS, indirect=True)
def test_the_path_follows_the_isa_level(cpu_isa: str) -> None:
    avx2 = "avx2-vnni" if cpu_features().avx_vnni else "avx2"  # from level avx2_vnni on
    want = {"portable": "portable", "avx2": "avx2", "avx2_vnni": avx2}.get(cpu_isa)
    if want is None:  # avx512 and up: AVX512-VNNI where the CPU has it, else the AVX2 path
        want = "avx512-vnni" if cpu_features().avx512_vnni else avx2
    assert quant_linear_path() == want


@pytest.mark.parametrize("qtype", TYPES)
def test_bf16_dequantized_alternative_is_exact_up_to_fp32_sums(qtype: Q) -> None:
    """The measured alternative (bench/kernels/linear.py): bf16 x times weights converted in registers."""
    if quant_linear_path() == "portable" or not isa_at_least("avx512_bf16"):
        pytest.skip("the alternative needs AVX512-BF16 and VNNI")
    m, n, k = shapes(qtype)[1]
    packed, w = weight(qtype, n, k)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(7)).bfloat16()
    out = torch.empty(m, n)
    core.quant_linear(int(qtype), x.data_ptr(), k, False, packed.data_ptr(), 0, 0, 0,
                      out.data_ptr(), n, True, m, n, k, 0, 2, False, True)  # fmt: skip
    xd = x.double().numpy()
    err = np.abs(out.numpy() - xd @ w.T.astype(np.float64))
    assert np.all(err <= 1e-6 * (np.abs(xd) @ np.abs(w.T)) + 1e-7)


ROWS = (1, 7, 64, 300)


def invariance_weight(qtype: Q, kind: str) -> tuple[torch.Tensor, int, int, int]:
    """The batch-invariance tests' weight: packed, output columns, gated width (0: plain), k."""
    k = 576 if qtype in (Q.Q4_1, Q.Q8_0) else 512
    if kind != "gated":
        return weight(qtype, 200, k)[0], 200, 0, k
    width = 100
    gate, up = gguf_rows(qtype, width, k, 1), gguf_rows(qtype, width, k, 2)
    table = gated_row_table(row_addresses(gate), row_addresses(up), width)
    return pack_quant_weight(int(qtype), table, k), width, width, k


@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q8_0, Q.Q4_K, Q.Q6_K])
@pytest.mark.parametrize("kind", ["bf16", "fp32-logits", "gated"])
@pytest.mark.parametrize("cpu_isa", CPU_ISAS, indirect=True)
def test_a_row_is_bit_identical_in_calls_of_1_7_64_and_300_rows(
    qtype: Q, kind: str, cpu_isa: str
) -> None:
    packed, n, width, k = invariance_weight(qtype, kind)
    x = torch.randn(300, k, generator=torch.Generator().manual_seed(6)).bfloat16()
    out_dtype = torch.float32 if kind == "fp32-logits" else torch.bfloat16

    def run(rows: torch.Tensor) -> torch.Tensor:
        out = torch.empty(rows.shape[0], n, dtype=out_dtype)
        quant_linear(out, rows, packed, int(qtype), None, None, width)
        return out

    full = run(x)
    for m in ROWS:
        for start in (0, 300 - m):
            assert torch.equal(run(x[start : start + m]), full[start : start + m]), (m, start)


def test_bad_arguments_are_refused() -> None:
    packed, _ = weight(Q.Q4_1, 64, 96)
    x = torch.randn(2, 96)
    with pytest.raises(ValueError, match="multiple of 32"):
        quant_linear(torch.empty(2, 64), torch.randn(2, 80), packed, int(Q.Q4_1), None, None, 0)
    with pytest.raises(ValueError, match="packed must be"):
        quant_linear(torch.empty(2, 96), x, packed, int(Q.Q4_1), None, None, 0)
    with pytest.raises(ValueError, match="no quantized kernel"):
        quant_linear(torch.empty(2, 64), x, packed, int(Q.Q5_0), None, None, 0)
    with pytest.raises(ValueError, match="multiple of 256"):
        pack_quant_weight(int(Q.Q4_K), np.zeros(4, np.int64), 96)


# ---- float activations (x kept in fp32) ----


def float_product(qtype: Q, packed: torch.Tensor, x: torch.Tensor, n: int, **kw) -> torch.Tensor:
    out = kw.pop("out", None)
    if out is None:
        out = torch.empty(x.shape[0], n, dtype=kw.pop("out_dtype", x.dtype))
    quant_linear(out, x, packed, int(qtype), kw.get("bias"), kw.get("residual"),
                 kw.get("gated_width", 0), 0, True)  # fmt: skip
    return out


def float_tolerance(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """(k + 4) 2^-24 sum |x| |w| per output (module docstring)."""
    return (x.shape[1] + 4) * 2.0**-24 * (np.abs(x) @ np.abs(w.T))


@pytest.mark.parametrize(("qtype", "shape"), CASES, ids=lambda v: getattr(v, "name", str(v)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("cpu_isa", CPU_ISAS, indirect=True)
def test_float_activations_match_the_dequantized_product(
    qtype: Q, shape: tuple[int, int, int], dtype: torch.dtype, cpu_isa: str
) -> None:
    m, n, k = shape
    packed, w = weight(qtype, n, k, seed=m)
    x = (torch.randn(m, k, generator=torch.Generator().manual_seed(n)) * 2).to(dtype)
    xd = x.double().numpy()
    got = float_product(qtype, packed, x, n, out_dtype=torch.float32).double().numpy()
    want = xd @ w.T.astype(np.float64)
    assert np.all(np.abs(got - want) <= float_tolerance(xd, w) + 1e-30)
    if dtype == torch.bfloat16:  # bf16 out: the same sums rounded once more
        got16 = float_product(qtype, packed, x, n).double().numpy()
        bound = float_tolerance(xd, w) + 2.0**-8 * np.abs(want)
        assert np.all(np.abs(got16 - want) <= bound + 1e-30)


@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q8_0, Q.Q4_K, Q.Q6_K])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("cpu_isa", CPU_ISAS, indirect=True)
def test_float_activations_bias_in_place_residual_and_gated(
    qtype: Q, dtype: torch.dtype, cpu_isa: str
) -> None:
    m, n, k = shapes(qtype)[1]
    packed, w = weight(qtype, n, k)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(m, k, generator=gen).to(dtype)
    bias = torch.randn(n, generator=gen).to(dtype)
    out = torch.randn(m, n, generator=gen).to(dtype)
    start = out.double().numpy().copy()
    float_product(qtype, packed, x, n, out=out, bias=bias, residual=out)  # residual is out itself
    xd = x.double().numpy()
    want = xd @ w.T.astype(np.float64) + bias.double().numpy() + start
    ulp = 2.0**-8 if dtype == torch.bfloat16 else 2.0**-23
    sizes = np.abs(want) + np.abs(start) + np.abs(bias.double().numpy())
    bound = float_tolerance(xd, w) + ulp * sizes
    assert np.all(np.abs(out.double().numpy() - want) <= bound)

    width = 40
    gate, up = gguf_rows(qtype, width, k, 1), gguf_rows(qtype, width, k, 2)
    table = gated_row_table(row_addresses(gate), row_addresses(up), width)
    gated = pack_quant_weight(int(qtype), table, k)
    got = float_product(qtype, gated, x, width, gated_width=width).double().numpy()
    wg, wu = dequantized(gate, qtype), dequantized(up, qtype)
    g, u = xd @ wg.T.astype(np.float64), xd @ wu.T.astype(np.float64)
    silu = g / (1 + np.exp(-g))
    # silu' <= 1.1 carries the gate's error to the output, |silu| the up's; SiLU's own ~1e-6.
    tol = 1.1 * float_tolerance(xd, wg) * np.abs(u) + np.abs(silu) * float_tolerance(xd, wu)
    out_ulp = 2.0**-8 if dtype == torch.bfloat16 else 1e-6
    assert np.all(np.abs(got - silu * u) <= tol + (out_ulp + 1e-6) * np.abs(silu * u) + 1e-30)


@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q8_0, Q.Q4_K, Q.Q6_K])
@pytest.mark.parametrize("kind", ["bf16", "fp32", "fp32-logits", "gated"])
@pytest.mark.parametrize("cpu_isa", CPU_ISAS, indirect=True)
def test_float_activations_a_row_is_bit_identical_in_calls_of_1_7_64_and_300_rows(
    qtype: Q, kind: str, cpu_isa: str
) -> None:
    packed, n, width, k = invariance_weight(qtype, kind)
    x = torch.randn(300, k, generator=torch.Generator().manual_seed(6))
    x = x if kind.startswith("fp32") else x.bfloat16()
    out_dtype = torch.float32 if kind == "fp32-logits" else x.dtype

    def run(rows: torch.Tensor) -> torch.Tensor:
        out = torch.empty(rows.shape[0], n, dtype=out_dtype)
        return float_product(qtype, packed, rows, n, out=out, gated_width=width)

    full = run(x)
    for m in ROWS:
        for start in (0, 300 - m, (300 - m) // 2):
            assert torch.equal(run(x[start : start + m]), full[start : start + m]), (m, start)


@pytest.mark.parametrize("cpu_isa", CPU_ISAS, indirect=True)
def test_the_float_activation_path_follows_the_isa_level(cpu_isa: str) -> None:
    """AVX2 + FMA from level avx2 up on x86 (AVX-512 levels included), portable loops below it
    and on aarch64 (every neon level)."""
    want = "avx2" if isa_at_least("avx2") else "portable"
    assert quant_linear_float_path() == want


def test_float_activations_and_dequant_bf16_exclude_each_other() -> None:
    packed, _ = weight(Q.Q4_1, 64, 96)
    x = torch.randn(2, 96).bfloat16()
    out = torch.empty(2, 64)
    with pytest.raises(ValueError, match="exclude each other"):
        core.quant_linear(int(Q.Q4_1), x.data_ptr(), 96, False, packed.data_ptr(), 0, 0, 0,
                          out.data_ptr(), 64, True, 2, 64, 96, 0, 1, False, True, 0, True)  # fmt: skip
