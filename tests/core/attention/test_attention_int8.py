"""int8 KV pages (--kv-cache-dtype int8): the native cache write quantizes exactly as the torch
reference does (the same bytes), and the paged-attention kernels at every ISA level match the
reference over the same quantized cache, windows and soft caps included, giving the portable
loops' bits and staying batch invariant."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
import torch

from bench.common.attention_batches import make_batch
from pagedserve.core.attention import ops, reference
from pagedserve.core.attention.base import (
    KV_CACHE_DTYPES,
    KV_SCALE_BYTES,
    kv_cache_dtype,
    kv_head_size,
)
from pagedserve.core.config import KV_CACHE_DTYPE_NAMES
from pagedserve.core.ops.cpu_features import forced_cpu_isa
from tests.core.attention.test_attention_invariance import SEQ_LEN, attend
from tests.core.attention.test_attention_ops import DECODE, EDGES, MIXED, attention_args

TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 2e-2}


def stored_batch(store: Callable[[torch.Tensor], torch.Tensor]):
    """A batch maker for levels_match_reference: make_batch's batch with its random history
    stored by `store` (int8 rows, fp8 rows, fp16), and this step's keys and values written by
    the native cache write (checked byte for byte against the reference's)."""

    def make(q_lens, seq_lens, *, dtype: torch.dtype, head_size: int, group: int, seed: int):
        b = make_batch(q_lens, seq_lens, group=group, head_size=head_size, page_size=16,
                       dtype=dtype, device="cpu", seed=seed)  # fmt: skip
        b.kv_cache = store(b.kv_cache)
        want = b.kv_cache.clone()
        reference.reshape_and_cache_reference(b.key, b.value, want, b.meta.slot_mapping)
        ops.reshape_and_cache(b.key, b.value, b.kv_cache, b.meta.slot_mapping)
        assert torch.equal(b.kv_cache.view(torch.uint8), want.view(torch.uint8))
        return b

    return make


int8_batch = stored_batch(reference.quantize_rows)


def run(b, window: int = 0, softcap: float = 0.0) -> torch.Tensor:
    out = torch.full_like(b.query, float("nan"))
    ops.paged_attention(*attention_args(b, out), sliding_window=window, logit_softcap=softcap)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cache_write_quantizes_like_the_reference(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(3)
    rows = torch.randn(40, 2, 64, generator=gen) * torch.logspace(-3, 3, 40)[:, None, None]
    rows[5] = 0.0  # an all-zero row: scale 0, values 0
    rows[7, 0, 3] = 1e4  # one outlier owns its row's scale
    rows = rows.to(dtype)
    cache = torch.zeros(2, 4, 2, 16, 64 + KV_SCALE_BYTES, dtype=torch.int8)
    want = cache.clone()
    slots = torch.randperm(64, generator=gen)[:40]
    slots[11] = -1  # skipped
    ops.reshape_and_cache(rows, -rows, cache, slots)
    reference.reshape_and_cache_reference(rows, -rows, want, slots)
    assert torch.equal(cache, want)
    assert kv_head_size(cache) == 64
    # Dequantized rows are within half a step (scale / 2) of the originals.
    got = reference.dequantize_rows(cache[0, slots[0] // 16, :, slots[0] % 16])
    step = rows[0].float().abs().amax(-1, keepdim=True) / 127
    assert ((got - rows[0].float()).abs() <= step / 2 * (1 + 1e-6)).all()
    assert (cache[0, slots[5] // 16, :, slots[5] % 16] == 0).all()


# (head size, group, sliding_window, logit_softcap): the vector steps' head sizes and the
# generic one, each option alone and both together.
SHAPES = [(64, 3, 0, 0.0), (128, 4, 24, 0.0), (48, 2, 0, 5.0), (64, 1, 24, 5.0)]


@pytest.mark.parametrize(("head_size", "group", "window", "softcap"), SHAPES)
def test_every_cpu_isa_level_matches_reference(
    cpu_isa: str, head_size: int, group: int, window: int, softcap: float
) -> None:
    """Every level widens the same int8 rows to the same floats, then takes the fp32 path's
    arithmetic: the reference within the usual tolerance, and the portable loops' bits
    (avx512_bf16 and amx included)."""
    levels_match_reference(int8_batch, cpu_isa, head_size, group, window, softcap)


def levels_match_reference(
    make, cpu_isa: str, head_size: int, group: int, window: int, softcap: float
) -> None:
    """make(q_lens, seq_lens, dtype=, head_size=, group=, seed=): a batch over a stored cache
    (int8 or fp16); the kernels at cpu_isa match the reference over it, and give the portable
    loops' bits."""
    for i, dtype in enumerate((torch.float32, torch.bfloat16)):
        for q_lens, seq_lens in (MIXED, DECODE, EDGES):
            b = make(q_lens, seq_lens, dtype=dtype, head_size=head_size, group=group, seed=i)
            m = b.meta
            want = reference.paged_attention_reference(
                b.query, b.kv_cache, m.page_table, m.seq_lens, m.query_start_loc, b.scale,
                window, softcap,
            )  # fmt: skip
            got = run(b, window, softcap)
            assert got.dtype == dtype
            tol = TOLERANCE[dtype]
            torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)
            if cpu_isa != "portable":
                with forced_cpu_isa("portable"):
                    portable = run(b, window, softcap)
                assert torch.equal(got, portable)


@pytest.mark.parametrize(("head_size", "group"), [(64, 3), (128, 1)])
@pytest.mark.parametrize(("window", "softcap"), [(0, 0.0), (40, 0.0), (0, 5.0)])
def test_prefill_chunk_equals_decode_bit_for_bit(
    cpu_isa: str, head_size: int, group: int, window: int, softcap: float
) -> None:
    chunks_equal_whole(reference.quantize_rows, torch.bfloat16, head_size, group, window, softcap,
                       extra=[[(0, 1), (1, 64), (64, 129), (129, SEQ_LEN)]])  # fmt: skip


def chunks_equal_whole(
    store: Callable[[torch.Tensor], torch.Tensor],
    query_dtype: torch.dtype,
    head_size: int,
    group: int,
    window: int,
    softcap: float,
    extra: Sequence[list[tuple[int, int]]] = (),
) -> None:
    """One request's attention over a random history stored by `store`, computed whole, in
    three chunks, token by token (and in `extra`'s chunkings): the same bits."""
    gen = torch.Generator().manual_seed(head_size)
    num_pages = -(-SEQ_LEN // 16) + 2
    kv_cache = store(torch.randn(2, num_pages, 2, 16, head_size, generator=gen))
    pages = torch.randperm(num_pages, generator=gen)[: -(-SEQ_LEN // 16)].int()
    query = torch.randn(SEQ_LEN, 2 * group, head_size, generator=gen).to(query_dtype)
    options = {"sliding_window": window, "logit_softcap": softcap}
    whole = attend(kv_cache, pages, query, [(0, SEQ_LEN)], **options)
    chunkings = [[(0, 70), (70, 71), (71, SEQ_LEN)], *extra, [(p, p + 1) for p in range(SEQ_LEN)]]
    for chunks in chunkings:
        assert torch.equal(attend(kv_cache, pages, query, chunks, **options), whole), chunks


def test_bad_int8_inputs_are_refused() -> None:
    b = make_batch(*DECODE, dtype=torch.float32)
    cache = reference.quantize_rows(b.kv_cache)
    with pytest.raises(ValueError, match="not supported with an int8 kv_cache"):
        ops.reshape_and_cache(b.key.half(), b.value.half(), cache, b.meta.slot_mapping)
    with pytest.raises(ValueError, match="head_size"):  # rows of a head size the cache lacks
        ops.reshape_and_cache(b.key[..., :32], b.value[..., :32], cache, b.meta.slot_mapping)
    with pytest.raises(ValueError, match="scale bytes"):
        ops.reshape_and_cache(b.key, b.value, cache[..., :4].contiguous(), b.meta.slot_mapping)


def test_kv_cache_dtype_names() -> None:
    assert tuple(KV_CACHE_DTYPES) == KV_CACHE_DTYPE_NAMES  # the CLI's choices
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert kv_cache_dtype("auto", torch.bfloat16, cpu) == torch.bfloat16
    assert kv_cache_dtype("bf16", torch.bfloat16, cpu) == torch.bfloat16
    assert kv_cache_dtype("int8", torch.bfloat16, cpu) == torch.int8
    for model in (torch.float32, torch.bfloat16, torch.float16):  # CUDA reads 8-bit pages too
        assert kv_cache_dtype("int8", model, cuda) == torch.int8
    with pytest.raises(ValueError, match="CPU kernels only"):
        kv_cache_dtype("fp16", torch.bfloat16, cuda)
    with pytest.raises(ValueError, match="differs from the model's dtype"):
        kv_cache_dtype("fp32", torch.bfloat16, cpu)
    with pytest.raises(ValueError, match="must be one of"):
        kv_cache_dtype("q4", torch.bfloat16, cpu)
