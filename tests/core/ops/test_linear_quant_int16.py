"""The quantized linear kernel with int16 activations (ops/linear_quant.py's int16_activations,
issue 42 item 5) at every ISA level this CPU runs: every level gives the portable loops' bits,
a row's bits do not depend on the call's rows, the path follows the level. The products against
the int16 oracle (x rounded per 32 features as the kernel does, d = max|x| / 32512) and the
unrounded product (half an int16 step per block) are test_linear_quant.py's int8-or-int16 tests.
"""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType as Q

from pagedserve.core.ops.cpu_features import CPU_ISAS, isa_at_least
from pagedserve.core.ops.linear_quant import (
    quant_linear,
    quant_linear_int16_path,
    quant_linear_path,
)
from pagedserve.core.ops.native import core
from tests.core.ops.test_linear_quant import invariance_weight, shapes, weight
from tests.quant_blocks import TYPES


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("cpu_isa", CPU_ISAS, indirect=True)
def test_every_level_gives_the_portable_loops_bits(qtype: Q, cpu_isa: str) -> None:
    """Exact int32 sums of an exact int16 product, folded alike: the same bits on every level
    (bf16 out with bias and an in-place residual, and fp32 logits)."""
    m, n, k = shapes(qtype)[2]
    packed, _ = weight(qtype, n, k)
    gen = torch.Generator().manual_seed(5)
    x = (torch.randn(m, k, generator=gen) * 3).bfloat16()
    bias = torch.randn(n, generator=gen).bfloat16()
    start = torch.randn(m, n, generator=gen).bfloat16()
    outs = []
    for portable in (False, True):
        out, logits = start.clone(), torch.empty(m, n)
        for o, b, float32_out in ((out, bias, False), (logits, None, True)):
            core.quant_linear(int(qtype), x.data_ptr(), k, False, packed.data_ptr(),
                              0 if b is None else b.data_ptr(), 0 if b is None else o.data_ptr(),
                              n, o.data_ptr(), n, float32_out, m, n, k, 0, 2, portable, False,
                              0, False, True)  # fmt: skip
        outs.append((out, logits))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q8_0, Q.Q6_K])
@pytest.mark.parametrize("kind", ["bf16", "gated"])
@pytest.mark.parametrize("cpu_isa", CPU_ISAS, indirect=True)
def test_a_row_is_bit_identical_in_calls_of_1_7_64_and_300_rows(
    qtype: Q, kind: str, cpu_isa: str
) -> None:
    packed, n, width, k = invariance_weight(qtype, kind)
    x = torch.randn(300, k, generator=torch.Generator().manual_seed(6)).bfloat16()

    def run(rows: torch.Tensor) -> torch.Tensor:
        out = torch.empty(rows.shape[0], n)
        quant_linear(out, rows, packed, int(qtype), None, None, width, 0, False, True)
        return out

    full = run(x)
    for m in (1, 7, 64):
        for start in (0, 300 - m, (300 - m) // 2):
            assert torch.equal(run(x[start : start + m]), full[start : start + m]), (m, start)


def edge_rows() -> torch.Tensor:
    """fp32 rows of 32-feature blocks that test the rounding's corners: zeros, exact ties
    (max 32512: x * inv is x itself), one huge value among small ones, denormals alone (inv
    overflows to inf), a NaN and an inf inside a block, the largest value negative."""
    ties = torch.tensor([32512.0] + [i + 0.5 for i in range(-15, 16)])
    huge = torch.cat([torch.tensor([3e38]), torch.linspace(-1, 1, 31)])
    tiny = torch.full((32,), 1e-42) * torch.arange(-16, 16)
    nan = torch.linspace(-2, 2, 32)
    nan[5] = float("nan")
    inf = torch.linspace(-2, 2, 32)
    inf[9] = float("inf")
    negative = torch.linspace(-7, 3, 32)
    blocks = [torch.zeros(32), ties, huge, tiny, nan, inf, negative, torch.randn(32) * 100]
    return torch.stack([torch.cat(blocks[i:] + blocks[:i]) for i in range(len(blocks))])


@pytest.mark.parametrize("cpu_isa", CPU_ISAS, indirect=True)
def test_the_vector_rows_round_corner_cases_as_the_plain_loop(cpu_isa: str) -> None:
    """The int16 rows at this level (AVX2 from level avx2 on x86) against the plain loop's,
    through the product (fp32 logits; a NaN in x clamps, as the loop's fmax does)."""
    x = edge_rows()
    m, k = x.shape
    packed, _ = weight(Q.Q8_0, 64, k)
    outs = []
    for portable in (False, True):
        out = torch.empty(m, 64)
        core.quant_linear(int(Q.Q8_0), x.data_ptr(), k, True, packed.data_ptr(), 0, 0, 0,
                          out.data_ptr(), 64, True, m, 64, k, 0, 1, portable, False, 0, False,
                          True)  # fmt: skip
        outs.append(out)
    assert torch.equal(outs[0].isnan(), outs[1].isnan())
    assert torch.equal(outs[0].nan_to_num(), outs[1].nan_to_num())


@pytest.mark.parametrize("cpu_isa", CPU_ISAS, indirect=True)
def test_the_int16_path_follows_the_isa_level(cpu_isa: str) -> None:
    """The VNNI kernel from level avx512 on CPUs with AVX512-VNNI (the int8 rows' path there),
    else the AVX2 kernel (its AVX-VNNI copy at avx2_vnni) from level avx2 up on x86; on aarch64
    the int8 rows' NEON kernel of the level; portable loops below those."""
    if quant_linear_path().startswith("neon"):
        assert quant_linear_int16_path() == quant_linear_path()
    elif not isa_at_least("avx2"):
        assert quant_linear_int16_path() == "portable"
    elif quant_linear_path() == "avx512-vnni":
        assert quant_linear_int16_path() == "avx512-vnni"
    else:
        assert quant_linear_int16_path() in ("avx2", "avx2-vnni")


def test_int16_and_float_activations_exclude_each_other() -> None:
    packed, _ = weight(Q.Q4_1, 64, 96)
    x, out = torch.randn(2, 96), torch.empty(2, 64)
    with pytest.raises(ValueError, match="exclude each other"):
        quant_linear(out, x, packed, int(Q.Q4_1), None, None, 0, 0, True, True)
    with pytest.raises(ValueError, match="excludes float_activations"):
        core.quant_linear(int(Q.Q4_1), x.data_ptr(), 96, True, packed.data_ptr(), 0, 0, 0,
                          out.data_ptr(), 64, True, 2, 64, 96, 0, 1, False, False, 0, True,
                          True)  # fmt: skip
