"""Attention backends: the paged KV layout, the per-step metadata, and the base class.

KV page layout (mirrored in cpp/include/pagedserve/paged_attention.hpp; a test checks both):
one tensor per layer,

    kv_cache[layer]: [2, num_pages, num_kv_heads, page_size, head_size]   (0 = K, 1 = V)

so the keys of one page and one KV head are a contiguous page_size x head_size tile. Token
slot s lives in page s // page_size at offset s % page_size; slot -1 means "do not write".

A batch mixes prefill chunks and decodes. Request r owns query rows
query_start_loc[r] : query_start_loc[r + 1]; its q_len = those rows, its seq_len counts every
token in its context after this step, so query row i sits at position seq_len - q_len + i and
attends causally to positions 0 .. that position.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

KV_CACHE_DIMS = ("kv", "num_pages", "num_kv_heads", "page_size", "head_size")


def kv_cache_shape(
    num_pages: int, page_size: int, num_kv_heads: int, head_size: int
) -> tuple[int, int, int, int, int]:
    return (2, num_pages, num_kv_heads, page_size, head_size)


@dataclass
class AttentionMetadata:
    """Per-step inputs shared by every layer, on the model's device."""

    slot_mapping: torch.Tensor  # [num_tokens] int64, -1 = skip
    page_table: torch.Tensor  # [num_reqs, max_pages_per_req] int32
    seq_lens: torch.Tensor  # [num_reqs] int32
    query_start_loc: torch.Tensor  # [num_reqs + 1] int32
    max_query_len: int
    max_seq_len: int

    @property
    def num_reqs(self) -> int:
        return int(self.seq_lens.shape[0])

    @property
    def is_pure_decode(self) -> bool:
        return self.max_query_len == 1


class AttentionBackend(ABC):
    """Writes this step's K/V into the paged cache, then attends over it."""

    name: str
    native_decoder_stack: bool = False
    batch_invariant: bool = True
    """Each query's output is fixed by its own position and keys alone, whatever shares the
    call (a kernel property; the native backend can trade it for speed, --no-deterministic)."""
    """Its kernels are the ones models/decoder_stack/ops.py calls, so a model may run all its layers in
    that one native call instead of calling forward() layer by layer."""

    @abstractmethod
    def forward(
        self,
        query: torch.Tensor,  # [num_tokens, num_heads, head_size]
        key: torch.Tensor,  # [num_tokens, num_kv_heads, head_size]
        value: torch.Tensor,  # [num_tokens, num_kv_heads, head_size]
        kv_cache: torch.Tensor,  # [2, num_pages, num_kv_heads, page_size, head_size]
        meta: AttentionMetadata,
        scale: float,
        sliding_window: int = 0,  # > 0: a query at position i sees keys j > i - sliding_window
        logit_softcap: float = 0.0,  # > 0: scores = logit_softcap * tanh(scores / logit_softcap)
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_size]
        ...
