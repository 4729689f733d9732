"""The native layer ops against the torch expressions they replace.

float32 must match bit for bit (the engine's fp32 greedy tokens must equal transformers').
bfloat16 computes in fp32 and rounds once, so it must equal the fp32 torch expression on the
upcast inputs, rounded to bf16. 64+ rows at these widths run the OpenMP branch, 1 row the serial one.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pagedserve.core.models.layers import rope_inv_freq, rope_tables
from pagedserve.core.ops import layer_ops
from pagedserve.core.ops.layer_ops import apply_rotary

DTYPES = (torch.float32, torch.bfloat16)
EPS = 1e-5


def _randn(*shape: int, dtype: torch.dtype, scale: float = 3.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=_gen(shape)) * scale).to(dtype)


def _gen(shape: tuple[int, ...]) -> torch.Generator:
    return torch.Generator().manual_seed(sum(shape) * 7919 + len(shape))


def _expect(ref_fp32: torch.Tensor, got: torch.Tensor) -> None:
    """got equals the fp32 reference rounded once to got's dtype, bit for bit."""
    assert torch.equal(got, ref_fp32.to(got.dtype)), (got.float() - ref_fp32).abs().max()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 576), (64, 576), (3, 7), (5, 100), (2, 2048), (97, 1000)])
def test_rms_norm_matches_torch(dtype: torch.dtype, shape: tuple[int, int], cpu_isa: str) -> None:
    x, weight = _randn(*shape, dtype=dtype), _randn(shape[1], dtype=dtype, scale=1.0)
    ref = F.rms_norm(x.float(), shape[1:], weight.float(), EPS)
    _expect(ref, layer_ops.rms_norm(x, weight, EPS))
    # A strided row view (every other row of a wider buffer) gives the same rows.
    wide = torch.zeros(shape[0], 2 * shape[1], dtype=dtype)
    wide[:, : shape[1]] = x
    _expect(ref, layer_ops.rms_norm(wide[:, : shape[1]], weight, EPS))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_tokens", [1, 64, 300])
def test_rotary_matches_apply_rotary_in_place(
    dtype: torch.dtype, num_tokens: int, cpu_isa: str
) -> None:
    heads, kv_heads, head_size = 9, 3, 64
    qkv = _randn(num_tokens, (heads + 2 * kv_heads) * head_size, dtype=dtype)
    qk = qkv[:, : (heads + kv_heads) * head_size].view(num_tokens, heads + kv_heads, head_size)
    cos_table, sin_table = rope_tables(rope_inv_freq(head_size, 10000.0, None), 4096, dtype, "cpu")
    positions = torch.randint(0, 4096, (num_tokens,), generator=_gen((num_tokens,)))
    cos, signed_sin = cos_table[positions].unsqueeze(1), sin_table[positions].unsqueeze(1)
    ref = apply_rotary(qk.float(), cos.float(), signed_sin.float())
    if dtype == torch.float32:  # the expression llama.py ran before, bit for bit
        assert torch.equal(ref, apply_rotary(qk, cos, signed_sin))
    v_before = qkv[:, (heads + kv_heads) * head_size :].clone()
    out = layer_ops.rotary(qk, cos, signed_sin)
    assert out.data_ptr() == qk.data_ptr()
    _expect(ref, qk)
    assert torch.equal(qkv[:, (heads + kv_heads) * head_size :], v_before)  # v untouched


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1536), (64, 1536), (3, 37), (7, 120), (513, 128)])
def test_silu_and_mul_matches_torch(
    dtype: torch.dtype, shape: tuple[int, int], cpu_isa: str
) -> None:
    n, size = shape
    gate_up = _randn(n, 2 * size, dtype=dtype, scale=4.0)
    gate_up[0, :4] = torch.tensor([-200.0, 200.0, 0.0, -0.0])  # exp's clamps and signed zero
    up = gate_up[:, size:].float()
    ref = F.silu(gate_up[:, :size].float()) * up  # llama.py's expression, on strided halves
    _expect(ref, layer_ops.silu_and_mul(gate_up))


def test_float16_and_other_devices_fall_back_to_torch() -> None:
    x, weight = _randn(4, 32, dtype=torch.float16), _randn(32, dtype=torch.float16)
    assert torch.equal(layer_ops.rms_norm(x, weight, EPS), F.rms_norm(x, (32,), weight, EPS))
    gate_up = _randn(4, 64, dtype=torch.float16)
    ref = F.silu(gate_up[:, :32]) * gate_up[:, 32:]
    assert torch.equal(layer_ops.silu_and_mul(gate_up), ref)
    qk, cos = _randn(4, 2, 32, dtype=torch.float16), _randn(4, 1, 32, dtype=torch.float16)
    assert torch.equal(layer_ops.rotary(qk, cos, cos), apply_rotary(qk, cos, cos))


def test_bad_shapes_and_dtypes_raise_value_error_naming_the_argument() -> None:
    x, weight = torch.randn(4, 16), torch.randn(16)
    with pytest.raises(ValueError, match="weight"):
        layer_ops.rms_norm(x, torch.randn(15), EPS)
    with pytest.raises(ValueError, match="weight"):
        layer_ops.rms_norm(x, weight.to(torch.bfloat16), EPS)
    with pytest.raises(ValueError, match="x must be contiguous in its last dim"):
        layer_ops.rms_norm(torch.randn(16, 4).t(), weight, EPS)
    with pytest.raises(ValueError, match="out has 5 rows"):
        layer_ops.rms_norm_eager(torch.empty(5, 16), x, weight, EPS)
    with pytest.raises(ValueError, match="out"):
        layer_ops.rms_norm_eager(torch.empty(4, 8), x, weight, EPS)
    with pytest.raises(ValueError, match="eps"):
        layer_ops.rms_norm(x, weight, -1.0)
    qk, cos = torch.randn(4, 3, 16), torch.randn(4, 1, 16)
    with pytest.raises(ValueError, match="cos"):
        layer_ops.rotary(qk, torch.randn(4, 1, 8), cos)
    with pytest.raises(ValueError, match="signed_sin"):
        layer_ops.rotary(qk, cos, torch.randn(4, 1, 32)[..., ::2])
    with pytest.raises(ValueError, match="head_size must be even"):
        layer_ops.rotary(torch.randn(4, 3, 15), cos[..., :15], cos[..., :15])
    with pytest.raises(ValueError, match="gate_up"):
        layer_ops.silu_and_mul(torch.randn(4, 15))
    with pytest.raises(ValueError, match="gate_up must be contiguous"):
        layer_ops.silu_and_mul(torch.randn(16, 4).t())


def test_registered_ops_trace_and_match_the_eager_bodies() -> None:
    x, weight = torch.randn(3, 32), torch.randn(32)
    gate_up, qk, cos = torch.randn(3, 64), torch.randn(3, 2, 32), torch.randn(3, 1, 32)
    torch.library.opcheck(layer_ops.rms_norm_op.op, (torch.empty(3, 32), x, weight, EPS))
    torch.library.opcheck(layer_ops.rotary_op.op, (qk, cos, cos))
    torch.library.opcheck(layer_ops.silu_and_mul_op.op, (torch.empty(3, 32), gate_up))
