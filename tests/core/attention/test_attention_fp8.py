"""fp8 e4m3 KV pages (--kv-cache-dtype fp8_e4m3, or fp8): the native cache write quantizes
exactly as the torch reference does (torch's float8_e4m3fn rounding after a per-row scale: the
same bytes), and the paged-attention kernels at every ISA level match the reference over the
same cache, windows and soft caps included, giving the portable loops' bits and staying batch
invariant; --kv-cache-dtype fp8 is CPU-only."""

from __future__ import annotations

import pytest
import torch

from bench.common.attention_batches import make_batch
from pagedserve.core.attention import ops, reference
from pagedserve.core.attention.base import KV_SCALE_BYTES, kv_cache_dtype, kv_head_size
from tests.core.attention.test_attention_int8 import (
    SHAPES,
    chunks_equal_whole,
    levels_match_reference,
    stored_batch,
)
from tests.core.attention.test_attention_ops import DECODE

FP8 = torch.float8_e4m3fn


def to_fp8(rows: torch.Tensor) -> torch.Tensor:
    return reference.quantize_rows(rows, FP8)


fp8_batch = stored_batch(to_fp8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cache_write_quantizes_like_torch(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(3)
    rows = torch.randn(40, 2, 64, generator=gen) * torch.logspace(-30, 30, 40)[:, None, None]
    rows[5] = 0.0  # an all-zero row: scale 0, values 0
    rows[7, 0, 3] = 1e4  # one outlier owns its row's scale: the rest fall to subnormals or 0
    # Ties of e4m3 after the scale (row max 448, so scale 1): 1 + 2^-4 (to even: 1), 1 + 3 x
    # 2^-4 (up), half the smallest subnormal (to 0), 1.5 of it (to 2 steps).
    rows[9, 1, :6] = torch.tensor([448.0, 1 + 2**-4, 1 + 3 * 2**-4, 2**-10, 3 * 2**-10, -448.0])
    rows = rows.to(dtype)
    cache = torch.zeros(2, 4, 2, 16, 64 + KV_SCALE_BYTES, dtype=FP8)
    want = cache.clone()
    slots = torch.randperm(64, generator=gen)[:40]
    slots[11] = -1  # skipped
    ops.reshape_and_cache(rows, -rows, cache, slots)
    reference.reshape_and_cache_reference(rows, -rows, want, slots)
    assert torch.equal(cache.view(torch.uint8), want.view(torch.uint8))
    assert kv_head_size(cache) == 64
    tie_row = cache[0, slots[9] // 16, 1, slots[9] % 16]
    assert tie_row[:6].float().tolist() == [448.0, 1.0, 1.25, 0.0, 2**-8, -448.0]
    # Dequantized values are within half an e4m3 step of the originals: 2^-4 of the value for
    # normals (3 mantissa bits), half of 2^-9 x scale below them.
    for i in (0, 20, 39):
        got = reference.dequantize_rows(cache[0, slots[i] // 16, :, slots[i] % 16])
        x = rows[i].float()
        scale = x.abs().amax(-1, keepdim=True) / 448
        bound = torch.maximum(x.abs() * 2**-4, scale * 2**-10)
        assert ((got - x).abs() <= bound * (1 + 1e-6)).all(), i
    assert (cache[0, slots[5] // 16, :, slots[5] % 16].view(torch.uint8) == 0).all()


@pytest.mark.parametrize(("head_size", "group", "window", "softcap"), SHAPES)
def test_every_cpu_isa_level_matches_reference(
    cpu_isa: str, head_size: int, group: int, window: int, softcap: float
) -> None:
    """Every level widens the same e4m3 rows to the same floats (F16C or NEON: the same exact
    products), then takes the fp32 path's arithmetic: the reference within the usual
    tolerance, and the portable loops' bits."""
    levels_match_reference(fp8_batch, cpu_isa, head_size, group, window, softcap)


@pytest.mark.parametrize(("head_size", "group"), [(64, 3), (128, 1)])
@pytest.mark.parametrize(("window", "softcap"), [(0, 0.0), (40, 0.0)])
def test_prefill_chunk_equals_decode_bit_for_bit(
    cpu_isa: str, head_size: int, group: int, window: int, softcap: float
) -> None:
    chunks_equal_whole(to_fp8, torch.bfloat16, head_size, group, window, softcap)


def test_kv_cache_dtype_fp8_names() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    for name in ("fp8", "fp8_e4m3"):  # vLLM's fp8 is e4m3
        assert kv_cache_dtype(name, torch.float32, cpu) == FP8
        assert kv_cache_dtype(name, torch.bfloat16, cpu) == FP8
        assert kv_cache_dtype(name, torch.float16, cuda) == FP8
    b = make_batch(*DECODE, dtype=torch.float32)
    cache = reference.quantize_rows(b.kv_cache, FP8)
    with pytest.raises(ValueError, match="not supported with a float8_e4m3fn kv_cache"):
        ops.reshape_and_cache(b.key.half(), b.value.half(), cache, b.meta.slot_mapping)
    with pytest.raises(ValueError, match="scale bytes"):
        ops.reshape_and_cache(b.key, b.value, cache[..., :4].contiguous(), b.meta.slot_mapping)
