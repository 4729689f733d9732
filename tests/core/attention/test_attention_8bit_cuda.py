"""8-bit KV pages on CUDA (--kv-cache-dtype int8 / fp8_e4m3 on a GPU): the CUDA cache write
quantizes exactly as the torch reference does (the same bytes: correctly rounded divisions,
half-to-even int8, saturating e4m3), and the CUDA decode and prefill kernels match the reference
over the same 8-bit cache, windows and soft caps included, under fp32, bf16 and fp16
activations. Skipped without a GPU (the `cuda` marker)."""

from __future__ import annotations

import pytest
import torch

from bench.common.attention_batches import make_batch
from pagedserve.core.attention import ops, reference
from tests.core.attention.test_attention_ops import DECODE, EDGES, MIXED, attention_args

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]

CODES = [torch.int8, torch.float8_e4m3fn]
TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}


def stored_on_cuda(q_lens, seq_lens, dtype, codes, head_size=64, group=3, seed=0):
    """make_batch's batch on the GPU with its history stored as `codes` rows, and this step's
    keys and values written by the CUDA cache write (checked byte for byte against the
    reference's write)."""
    b = make_batch(q_lens, seq_lens, group=group, head_size=head_size, page_size=16,
                   dtype=dtype, device="cuda", seed=seed)  # fmt: skip
    b.kv_cache = reference.quantize_rows(b.kv_cache.float(), codes).to(b.kv_cache.device)
    want = b.kv_cache.clone()
    reference.reshape_and_cache_reference(b.key, b.value, want, b.meta.slot_mapping)
    ops.reshape_and_cache(b.key, b.value, b.kv_cache, b.meta.slot_mapping)
    torch.cuda.synchronize()
    assert torch.equal(b.kv_cache.view(torch.uint8), want.view(torch.uint8))
    return b


@pytest.mark.parametrize("codes", CODES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cuda_cache_write_quantizes_like_the_reference(codes, dtype) -> None:
    gen = torch.Generator().manual_seed(3)
    rows = torch.randn(40, 2, 64, generator=gen) * torch.logspace(-3, 3, 40)[:, None, None]
    rows[5] = 0.0  # an all-zero row: scale 0, codes 0
    rows[7, 0, 3] = 1e3  # one outlier owns its row's scale
    rows = rows.to(dtype).cuda()
    cache = torch.zeros(2, 4, 2, 16, 68, dtype=codes, device="cuda")
    want = cache.clone()
    slots = torch.randperm(64, generator=gen)[:40].cuda()
    slots[11] = -1  # skipped
    ops.reshape_and_cache(rows, -rows, cache, slots)
    reference.reshape_and_cache_reference(rows, -rows, want, slots)
    torch.cuda.synchronize()
    assert torch.equal(cache.view(torch.uint8), want.view(torch.uint8))


@pytest.mark.parametrize("codes", CODES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("head_size", "group", "window", "softcap"),
                         [(64, 3, 0, 0.0), (128, 4, 24, 0.0), (64, 1, 24, 5.0)])  # fmt: skip
def test_cuda_kernels_match_reference(codes, dtype, head_size, group, window, softcap) -> None:
    for i, (q_lens, seq_lens) in enumerate((MIXED, DECODE, EDGES)):
        b = stored_on_cuda(q_lens, seq_lens, dtype, codes, head_size, group, seed=i)
        m = b.meta
        want = reference.paged_attention_reference(
            b.query.cpu(), b.kv_cache.cpu(), m.page_table.cpu(), m.seq_lens.cpu(),
            m.query_start_loc.cpu(), b.scale, window, softcap,
        )  # fmt: skip
        out = torch.full_like(b.query, float("nan"))
        ops.paged_attention(*attention_args(b, out), sliding_window=window, logit_softcap=softcap)
        tol = TOLERANCE[dtype]
        torch.testing.assert_close(out.float().cpu(), want.float(), atol=tol, rtol=tol)


def test_cuda_decode_over_long_8bit_context_uses_splits() -> None:
    """A decode over more keys than one split (kCudaDecodeSplitLen = 512): the merge of the
    splits' partial sums over 8-bit pages."""
    b = stored_on_cuda([1, 1], [1500, 700], torch.bfloat16, torch.int8)
    m = b.meta
    want = reference.paged_attention_reference(
        b.query.cpu(), b.kv_cache.cpu(), m.page_table.cpu(), m.seq_lens.cpu(),
        m.query_start_loc.cpu(), b.scale, 0, 0.0,
    )  # fmt: skip
    out = torch.full_like(b.query, float("nan"))
    ops.paged_attention(*attention_args(b, out))
    torch.testing.assert_close(out.float().cpu(), want.float(), atol=2e-2, rtol=2e-2)
