"""Sliding-window attention and logit soft-capping (issue 11) in the paged kernels: the torch
reference against transformers' own mask and Gemma 2's capping, the CPU kernels against the
reference over page boundaries, windows smaller than a page, prefill chunks that straddle the
window and soft-capping on and off, and a window's batch invariance (prefill chunk vs decode)."""

from __future__ import annotations

import itertools

import pytest
import torch
from test_attention_invariance import SEQ_LEN, attend, cached_request

from bench.common.attention_batches import devices, make_batch
from pagedserve.core.attention import ops, reference

# Decodes just inside / at / past page edges, a fresh prompt, chunks that start mid-page and
# straddle the window's start, and a request with no query this step.
Q_LENS = [1, 1, 1, 37, 19, 0, 23]
SEQ_LENS = [9, 16, 70, 100, 33, 5, 23]
WINDOWS = [0, 1, 5, 16, 23, 64, 200]  # 0: none; 5 < page_size; 200 > every context
TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 2e-2, torch.float16: 4e-3}


def run(
    b, device_out: torch.Tensor, window: int, softcap: float, batch_invariant: bool = True
) -> torch.Tensor:
    m = b.meta
    ops.paged_attention(device_out, b.query, b.kv_cache, m.page_table, m.seq_lens,
                        m.query_start_loc, m.max_query_len, m.max_seq_len, b.scale,
                        sliding_window=window, logit_softcap=softcap,
                        batch_invariant=batch_invariant)  # fmt: skip
    return device_out


def want(b, window: int, softcap: float) -> torch.Tensor:
    m = b.meta
    return reference.paged_attention_reference(
        b.query, b.kv_cache, m.page_table, m.seq_lens, m.query_start_loc, b.scale, window, softcap
    )


def test_reference_mask_and_cap_are_transformers() -> None:
    """The reference's window is transformers' sliding_window_causal_mask_function, and its
    cap is Gemma 2's (scores / cap, tanh, * cap, before the mask)."""
    masking = pytest.importorskip("transformers.masking_utils")
    b = make_batch([30], [30], num_kv_heads=1, group=2, head_size=16, page_size=8)
    for window, cap in itertools.product((1, 4, 9, 40), (0.0, 0.7)):
        q, k, v = b.query.float(), *(t.float() for t in reference.gather_kv(
            b.kv_cache, b.meta.page_table[0], 30))  # fmt: skip
        scores = torch.einsum("qhd,khd->hqk", q, k.repeat_interleave(2, dim=1)) * b.scale
        if cap:
            scores = torch.tanh(scores / cap) * cap
        idx = torch.arange(30)
        mask_fn = masking.sliding_window_causal_mask_function(window)
        allowed = mask_fn(0, 0, idx[:, None], idx[None, :])
        probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
        dense = torch.einsum("hqk,khd->qhd", probs, v.repeat_interleave(2, dim=1))
        torch.testing.assert_close(want(b, window, cap), dense, rtol=1e-6, atol=1e-6)
    # The window really cuts: the last query with window 1 attends only to itself.
    only_self = want(b, 1, 0.0)[-1]
    torch.testing.assert_close(only_self, v[-1].repeat_interleave(2, dim=0), rtol=0, atol=0)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("head_size", "group", "page_size"), [(64, 3, 16), (128, 2, 8), (48, 1, 16)]
)
@pytest.mark.parametrize("batch_invariant", [True, False], ids=["invariant", "fast_decode"])
def test_window_and_softcap_match_the_reference(
    device: str,
    dtype: torch.dtype,
    head_size: int,
    group: int,
    page_size: int,
    batch_invariant: bool,
) -> None:
    """Either decode scoring (batch_invariant False: a dot per key for items of under 8 query
    vectors, the decodes here) within the dtype's tolerance of the reference."""
    b = make_batch(Q_LENS, SEQ_LENS, group=group, head_size=head_size, page_size=page_size,
                   dtype=dtype, device=device, seed=head_size)  # fmt: skip
    b.query.mul_(3)  # larger scores, so the cap matters
    for window, softcap in itertools.product(WINDOWS, (0.0, 2.5)):
        got = run(b, torch.full_like(b.query, float("nan")), window, softcap, batch_invariant)
        expect = want(b, window, softcap)
        tol = TOLERANCE[dtype]
        torch.testing.assert_close(got.float().cpu(), expect.float().cpu(), atol=tol, rtol=tol,
                                   msg=lambda m, w=window, c=softcap: f"window {w} cap {c}: {m}")  # fmt: skip


def test_decode_past_many_splits_with_a_window() -> None:
    """A long decode context (several CUDA splits; many CPU blocks) with a window inside it."""
    for device in ("cpu", *(["cuda"] if torch.cuda.is_available() else [])):
        b = make_batch([1, 1], [1500, 700], head_size=64, page_size=16, device=device, seed=2)
        for window in (1, 100, 600, 1200):
            got = run(b, torch.empty_like(b.query), window, 0.0)
            torch.testing.assert_close(got.cpu(), want(b, window, 0.0).cpu(), atol=2e-5,
                                       rtol=2e-5)  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("window", "softcap"), [(7, 0.0), (40, 0.0), (70, 1.5), (0, 1.5)])
def test_window_keeps_prefill_and_decode_bit_identical(
    dtype: torch.dtype, window: int, softcap: float
) -> None:
    kv_cache, pages, query = cached_request(64, 3, 16, dtype, seed=window)
    query.mul_(3)
    options = {"sliding_window": window, "logit_softcap": softcap}
    whole = attend(kv_cache, pages, query, [(0, SEQ_LEN)], **options)
    for chunks in ([(p, p + 1) for p in range(SEQ_LEN)], [(0, 50), (50, 51), (51, SEQ_LEN)]):
        assert torch.equal(attend(kv_cache, pages, query, chunks, **options), whole)


def test_bad_options_are_refused() -> None:
    b = make_batch([1], [5])
    out = torch.empty_like(b.query)
    with pytest.raises(ValueError, match="sliding_window"):
        run(b, out, -1, 0.0)
    with pytest.raises(ValueError, match="logit_softcap"):
        run(b, out, 0, float("nan"))
    with pytest.raises(ValueError, match="logit_softcap"):
        run(b, out, 0, -2.0)


def test_opcheck_with_the_options() -> None:
    b = make_batch([3, 1], [7, 20], group=2)
    m = b.meta
    args = (torch.empty_like(b.query), b.query, b.kv_cache, m.page_table, m.seq_lens,
            m.query_start_loc, m.max_query_len, m.max_seq_len, b.scale)  # fmt: skip
    torch.library.opcheck(ops.paged_attention.op, args, {"sliding_window": 4, "logit_softcap": 3.0})
