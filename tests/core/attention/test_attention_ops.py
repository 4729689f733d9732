"""The native paged-attention ops against the torch reference over a grid of shapes."""

from __future__ import annotations

import itertools

import pytest
import torch

from bench.common.attention_batches import devices, make_batch
from pagedserve.core.attention import ops, reference
from pagedserve.core.ops.cpu_features import forced_cpu_isa

# A mixed batch: a one-token prompt, a request with no query this step, decodes at and across
# page boundaries, a prefill chunk that starts mid-page and spans pages, and a fresh prompt.
MIXED = ([1, 0, 1, 1, 19, 33], [1, 8, 17, 64, 70, 33])
DECODE = ([1, 1, 1], [5, 100, 257])
GRID = list(itertools.product((8, 16, 32), (64, 128), (1, 3, 4)))
# Edges of the CPU kernels' vector paths: contexts around the 16-key score chunks and 64-key
# blocks (and a single key), plus prefill chunks whose query vectors are not a multiple of 4.
EDGES = ([1, 1, 1, 1, 1, 1, 5, 37], [1, 15, 16, 17, 63, 129, 100, 70])
# Groups on both sides of the CPU switch from per-key dots (< 8 vectors) to transposed keys.
EDGE_GRID = list(itertools.product((64, 128), (1, 2, 3, 4, 7, 8)))
TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 2e-2, torch.float16: 4e-3}


def attention_args(b, out: torch.Tensor, query: torch.Tensor | None = None) -> tuple:
    """paged_attention's arguments for batch b (its own query unless another is given)."""
    m = b.meta
    q = b.query if query is None else query
    return (out, q, b.kv_cache, m.page_table, m.seq_lens, m.query_start_loc, m.max_query_len,
            m.max_seq_len, b.scale)  # fmt: skip


def run_native(b) -> torch.Tensor:
    out = torch.full_like(b.query, float("nan"))
    ops.paged_attention(*attention_args(b, out))
    return out


def run_reference(b) -> torch.Tensor:
    m = b.meta
    return reference.paged_attention_reference(
        b.query, b.kv_cache, m.page_table, m.seq_lens, m.query_start_loc, b.scale
    )


def assert_close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    # bf16/fp16 outputs are rounded once; compare against the reference rounded the same way.
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(got.float().cpu(), want.float().cpu(), atol=tol, rtol=tol)


def dtypes_for(device: str) -> list[torch.dtype]:
    extra = [torch.float16] if device == "cuda" else []
    return [torch.float32, torch.bfloat16, *extra]


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize(("page_size", "head_size", "group"), GRID)
def test_attention_matches_reference(
    device: str, page_size: int, head_size: int, group: int
) -> None:
    for i, dtype in enumerate(dtypes_for(device)):
        for q_lens, seq_lens in (MIXED, DECODE):
            b = make_batch(
                q_lens,
                seq_lens,
                group=group,
                head_size=head_size,
                page_size=page_size,
                dtype=dtype,
                device=device,
                seed=i,
            )
            assert_close(run_native(b), run_reference(b), dtype)


@pytest.mark.parametrize(("head_size", "group"), [(64, 1), (128, 4), (48, 3)])
def test_every_cpu_isa_level_matches_reference(cpu_isa: str, head_size: int, group: int) -> None:
    """Each ISA level has its own copy of the CPU kernels (portable loops, AVX2, AVX-512)."""
    for i, dtype in enumerate((torch.float32, torch.bfloat16)):
        for q_lens, seq_lens in (MIXED, DECODE, EDGES):
            b = make_batch(q_lens, seq_lens, group=group, head_size=head_size, page_size=16,
                           dtype=dtype, device="cpu", seed=i)  # fmt: skip
            assert_close(run_native(b), run_reference(b), dtype)


@pytest.mark.parametrize(("head_size", "group"), [(64, 3), (128, 4), (48, 3)])
@pytest.mark.parametrize(("window", "softcap"), [(0, 0.0), (24, 0.0), (0, 5.0)])
def test_every_cpu_isa_level_gives_the_portable_bits(
    cpu_isa: str, head_size: int, group: int, window: int, softcap: float
) -> None:
    """With --deterministic every level rounds alike (issue 24): fp32 caches, and bf16 ones
    widened to fp32, give the portable loops' bits on every level; only bf16 with vdpbf16ps
    (avx512_bf16 and amx: pair products summed in hardware) rounds its own way."""
    for i, dtype in enumerate((torch.float32, torch.bfloat16)):
        if dtype == torch.bfloat16 and cpu_isa in ("avx512_bf16", "amx") and head_size % 32 == 0:
            continue
        for q_lens, seq_lens in (MIXED, DECODE, EDGES):
            b = make_batch(q_lens, seq_lens, group=group, head_size=head_size, page_size=16,
                           dtype=dtype, device="cpu", seed=i)  # fmt: skip
            options = {"sliding_window": window, "logit_softcap": softcap}
            got = torch.full_like(b.query, float("nan"))
            ops.paged_attention(*attention_args(b, got), **options)
            with forced_cpu_isa("portable"):
                want = torch.full_like(b.query, float("nan"))
                ops.paged_attention(*attention_args(b, want), **options)
            assert torch.equal(got, want), (dtype, (got.float() - want.float()).abs().max())


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize(("head_size", "group"), EDGE_GRID)
def test_vector_path_edges(device: str, head_size: int, group: int) -> None:
    for i, dtype in enumerate(dtypes_for(device)):
        b = make_batch(
            *EDGES, group=group, head_size=head_size, dtype=dtype, device=device, seed=10 + i
        )
        assert_close(run_native(b), run_reference(b), dtype)


@pytest.mark.parametrize("device", devices())
def test_unusual_head_size_keeps_the_portable_path(device: str) -> None:
    """head_size 80 is no multiple of 32: the CPU kernel's runtime-size loops serve it."""
    for dtype in dtypes_for(device):
        b = make_batch(*MIXED, group=3, head_size=80, dtype=dtype, device=device, seed=5)
        assert_close(run_native(b), run_reference(b), dtype)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize(
    ("q_lens", "seq_lens"),
    [
        ([300, 1], [300, 3000]),  # many query blocks per request (a long decode rides along)
        ([1, 1, 1], [3000, 700, 512]),
    ],  # pure decode: several context splits per row on CUDA
)
def test_long_contexts(device: str, q_lens: list[int], seq_lens: list[int]) -> None:
    b = make_batch(q_lens, seq_lens, num_kv_heads=3, group=3, device=device, seed=3)
    assert_close(run_native(b), run_reference(b), torch.float32)


@pytest.mark.parametrize("device", devices())
def test_reshape_and_cache_matches_reference(device: str) -> None:
    for dtype in dtypes_for(device):
        b = make_batch(*MIXED, num_kv_heads=3, dtype=dtype, device=device)
        slots = b.meta.slot_mapping.clone()
        slots[::4] = -1  # skipped rows must leave the cache untouched
        want = b.kv_cache.clone()
        reference.reshape_and_cache_reference(b.key, b.value, want, slots)
        ops.reshape_and_cache(b.key, b.value, b.kv_cache, slots)
        assert torch.equal(b.kv_cache, want)


@pytest.mark.parametrize("device", devices())
def test_strided_views_of_a_fused_projection(device: str) -> None:
    b = make_batch(*MIXED, num_kv_heads=2, group=2, device=device)
    num_tokens, d = b.query.shape[0], b.query.shape[2]
    fused = torch.cat([b.query, b.key, b.value], dim=1)  # [T, H + 2 * KH, D], like a qkv matmul
    q, k, v = fused.split([4, 2, 2], dim=1)
    assert not q.is_contiguous()
    ops.reshape_and_cache(k, v, b.kv_cache, b.meta.slot_mapping)
    want_cache = b.kv_cache.clone()
    out = torch.empty(num_tokens, 8, d, device=device)[:, ::2]  # strided output too
    ops.paged_attention(*attention_args(b, out, q))
    b.query = q.contiguous()
    assert torch.equal(b.kv_cache, want_cache)
    assert_close(out, run_reference(b), torch.float32)


@pytest.mark.parametrize("device", devices())
def test_opcheck(device: str) -> None:
    b = make_batch([3, 1], [3, 20], group=2, device=device)
    m = b.meta
    torch.library.opcheck(
        torch.ops.pagedserve.reshape_and_cache.default, (b.key, b.value, b.kv_cache, m.slot_mapping)
    )
    out = torch.empty_like(b.query)
    torch.library.opcheck(torch.ops.pagedserve.paged_attention.default, attention_args(b, out))


def test_single_row_page_table_with_an_odd_stride() -> None:
    """A [1, n] page table sliced from a transposed tensor has stride(0) == 1; rows beyond the
    first are never read, so only its width bounds the request."""
    torch.manual_seed(0)
    page_size, num_kv_heads, head_size, seq_len = 8, 2, 64, 20
    kv_cache = torch.randn(2, 6, num_kv_heads, page_size, head_size)
    page_table = torch.tensor([[4], [1], [5]], dtype=torch.int32).t()  # [1, 3], strides (1, 1)
    assert page_table.stride(0) == 1
    query = torch.randn(1, 4, head_size)
    out = torch.empty_like(query)
    seq_lens = torch.tensor([seq_len], dtype=torch.int32)
    query_start_loc = torch.tensor([0, 1], dtype=torch.int32)
    torch.ops.pagedserve.paged_attention(
        out, query, kv_cache, page_table, seq_lens, query_start_loc, 1, seq_len, 0.125
    )
    expected = reference.paged_attention_reference(
        query, kv_cache, page_table.contiguous(), seq_lens, query_start_loc, 0.125
    )
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
