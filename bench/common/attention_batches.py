"""Random paged-attention batches for the op tests: scattered pages, mixed prefill and decode."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pagedserve.core.attention.base import AttentionMetadata, kv_cache_shape


@dataclass
class Batch:
    query: torch.Tensor  # [num_tokens, num_heads, head_size]
    key: torch.Tensor  # [num_tokens, num_kv_heads, head_size]: this step's new keys
    value: torch.Tensor
    kv_cache: torch.Tensor  # random history; this step's slots still hold random values
    meta: AttentionMetadata

    @property
    def scale(self) -> float:
        return self.query.shape[2] ** -0.5


def make_batch(
    q_lens: list[int],
    seq_lens: list[int],
    *,
    num_kv_heads: int = 2,
    group: int = 1,
    head_size: int = 64,
    page_size: int = 16,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    seed: int = 0,
) -> Batch:
    """Each request r gets its own pages, shuffled across a cache with spare pages."""
    gen = torch.Generator().manual_seed(seed)
    pages_per_req = [-(-s // page_size) for s in seq_lens]
    max_pages = max(pages_per_req)
    num_pages = sum(pages_per_req) + 3
    order = torch.randperm(num_pages, generator=gen)
    page_table = torch.zeros(len(seq_lens), max_pages + 1, dtype=torch.int32)  # +1: padding
    slot_mapping, used = [], 0
    for r, (q_len, seq_len) in enumerate(zip(q_lens, seq_lens, strict=True)):
        pages = order[used : used + pages_per_req[r]]
        used += pages_per_req[r]
        page_table[r, : len(pages)] = pages.int()
        for pos in range(seq_len - q_len, seq_len):
            slot_mapping.append(int(pages[pos // page_size]) * page_size + pos % page_size)
    num_tokens, num_heads = sum(q_lens), num_kv_heads * group

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(dtype).to(device)

    qsl = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slot_mapping, dtype=torch.int64, device=device),
        page_table=page_table.to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        query_start_loc=qsl.to(device),
        max_query_len=max(q_lens),
        max_seq_len=max(seq_lens),
    )
    return Batch(
        query=rand(num_tokens, num_heads, head_size),
        key=rand(num_tokens, num_kv_heads, head_size),
        value=rand(num_tokens, num_kv_heads, head_size),
        kv_cache=rand(*kv_cache_shape(num_pages, page_size, num_kv_heads, head_size)),
        meta=meta,
    )


def devices() -> list:
    """ "cpu", plus "cuda" (marked, skipped without a GPU)."""
    import pytest

    cuda = pytest.param(
        "cuda",
        marks=[
            pytest.mark.cuda,
            pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
        ],
    )
    return ["cpu", cuda]
