"""fp16 KV pages under fp32 or bf16 activations (--kv-cache-dtype fp16 on the CPU): the native
cache write rounds exactly as torch's .to(float16) does (the same bits: ties to even, overflow
to inf, subnormals), and the paged-attention kernels at every ISA level match the reference over
the same fp16 cache, windows and soft caps included, giving the portable loops' bits and staying
batch invariant; the engine's --kv-cache-dtype takes fp16 under a float32 or bf16 model on the
CPU and refuses it elsewhere."""

from __future__ import annotations

import pytest
import torch

from bench.common.attention_batches import make_batch
from pagedserve.core.attention import ops
from pagedserve.core.attention.base import kv_cache_dtype, kv_head_size
from tests.core.attention.test_attention_int8 import (
    SHAPES,
    chunks_equal_whole,
    levels_match_reference,
    stored_batch,
)
from tests.core.attention.test_attention_ops import DECODE

fp16_batch = stored_batch(torch.Tensor.half)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cache_write_rounds_like_torch(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(5)
    rows = torch.randn(48, 2, 64, generator=gen) * torch.logspace(-9, 5, 48)[:, None, None]
    # Corners: ties at 1 + 2^-11 (to even: 1) and 1 + 3 x 2^-11 (up), the largest half and the
    # halfway point to inf, the smallest subnormal and half of it (a tie: to 0), inf, zeros.
    corners = [1 + 2**-11, 1 + 3 * 2**-11, 65504.0, 65519.0, 65520.0, 2**-24, 2**-25,
               3 * 2**-25, float("inf"), -0.0, 1e-40, -70000.0]  # fmt: skip
    rows[3, 0, : len(corners)] = torch.tensor(corners)
    rows = rows.to(dtype)
    cache = torch.zeros(2, 4, 2, 16, 64, dtype=torch.float16)
    slots = torch.randperm(64, generator=gen)[:48]
    slots[9] = -1  # skipped
    ops.reshape_and_cache(rows, -rows, cache, slots)
    keep = slots >= 0
    got_k = cache[0, slots[keep] // 16, :, slots[keep] % 16]
    got_v = cache[1, slots[keep] // 16, :, slots[keep] % 16]
    assert torch.equal(got_k.view(torch.int16), rows[keep].half().view(torch.int16))
    assert torch.equal(got_v.view(torch.int16), (-rows[keep]).half().view(torch.int16))
    assert kv_head_size(cache) == 64
    untouched = sorted(set(range(64)) - set(slots[keep].tolist()))  # the skipped slot's too
    assert len(untouched) == 64 - 47
    assert all((cache[:, s // 16, :, s % 16] == 0).all() for s in untouched)


@pytest.mark.parametrize(("head_size", "group", "window", "softcap"), SHAPES)
def test_every_cpu_isa_level_matches_reference(
    cpu_isa: str, head_size: int, group: int, window: int, softcap: float
) -> None:
    """Every level widens the same fp16 values to the same floats, then takes the fp32 path's
    arithmetic: the reference within the usual tolerance, and the portable loops' bits."""
    levels_match_reference(fp16_batch, cpu_isa, head_size, group, window, softcap)


@pytest.mark.parametrize(("head_size", "group"), [(64, 3), (128, 1)])
@pytest.mark.parametrize(("window", "softcap"), [(0, 0.0), (40, 0.0)])
def test_prefill_chunk_equals_decode_bit_for_bit(
    cpu_isa: str, head_size: int, group: int, window: int, softcap: float
) -> None:
    chunks_equal_whole(torch.Tensor.half, torch.float32, head_size, group, window, softcap)


def test_kv_cache_dtype_fp16_under_fp32_and_bf16_models() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert kv_cache_dtype("fp16", torch.float32, cpu) == torch.float16
    assert kv_cache_dtype("fp16", torch.bfloat16, cpu) == torch.float16
    assert kv_cache_dtype("fp16", torch.float16, cuda) == torch.float16  # CUDA's own dtype
    with pytest.raises(ValueError, match="CPU kernels only"):
        kv_cache_dtype("fp16", torch.bfloat16, cuda)
    b = make_batch(*DECODE, group=2, head_size=64, page_size=16, dtype=torch.float32,
                   device="cpu", seed=0)  # fmt: skip
    with pytest.raises(ValueError, match="not supported with a float16 kv_cache"):
        ops.reshape_and_cache(b.key.double(), b.value.double(), b.kv_cache.half(),
                              b.meta.slot_mapping)  # fmt: skip
