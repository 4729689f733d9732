"""The native attention backend: the pagedserve custom ops (CPU kernels or CUDA kernels)."""

from __future__ import annotations

import torch

from pagedserve.core.attention import ops
from pagedserve.core.attention.base import AttentionBackend, AttentionMetadata


class NativeAttentionBackend(AttentionBackend):
    """Writes this step's K/V with reshape_and_cache, then runs paged_attention over the cache."""

    name = "native"
    native_decoder_stack = True

    def __init__(self, batch_invariant: bool = True) -> None:
        self.batch_invariant = batch_invariant

    def forward(
        self,
        query: torch.Tensor,  # [num_tokens, num_heads, head_size]
        key: torch.Tensor,  # [num_tokens, num_kv_heads, head_size]
        value: torch.Tensor,  # [num_tokens, num_kv_heads, head_size]
        kv_cache: torch.Tensor,  # [2, num_pages, num_kv_heads, page_size, head_size]
        meta: AttentionMetadata,
        scale: float,
        sliding_window: int = 0,
        logit_softcap: float = 0.0,
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_size]
        ops.reshape_and_cache(key, value, kv_cache, meta.slot_mapping)
        out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
        ops.paged_attention(
            out,
            query,
            kv_cache,
            meta.page_table,
            meta.seq_lens,
            meta.query_start_loc,
            meta.max_query_len,
            meta.max_seq_len,
            scale,
            sliding_window,
            logit_softcap,
            self.batch_invariant,
        )
        return out
