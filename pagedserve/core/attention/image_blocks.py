"""Images whose tokens attend to each other both ways inside a causal language model (Gemma 3).

The paged kernels mask causally. A step whose chunks hold image tokens runs them as usual
(every row's K/V written, every row attended causally), then the image rows are attended again
here, in torch, with each image's block opened: the query at position i of an image spanning
[start, end) sees key j iff (j <= i or start <= j < end), and in a sliding layer also
i - j < window (transformers' mask: causal OR block, AND the window). Those rows' outputs
replace the kernel's. The image's later keys are in the cache by then because the scheduler
never ends a chunk inside such an image (Scheduler.add_request's whole_spans); a chunk that
starts inside one (a prefix-cache hit) finds the earlier keys in the cache, computed by a
request that saw the whole image. Text rows need nothing: causally they see every earlier
image token already.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import torch

from pagedserve.core.attention.base import AttentionBackend, AttentionMetadata
from pagedserve.core.attention.reference import gather_kv, masked_attention


@dataclass(frozen=True)
class ImageBlock:
    """An image's query rows in a step: request `request` (its page-table row), positions
    [first, end) at step rows [row, row + end - first). `end` is where the image ends (the
    chunk reaches it); `first` is where it starts, or the chunk's start if later."""

    request: int
    first: int
    end: int
    row: int


@dataclass
class ImageBlockMetadata(AttentionMetadata):
    """A step's metadata with the image blocks its chunks hold."""

    blocks: list[ImageBlock] = field(default_factory=list)

    @classmethod
    def of(cls, meta: AttentionMetadata, blocks: list[ImageBlock]) -> ImageBlockMetadata:
        base = {f.name: getattr(meta, f.name) for f in fields(AttentionMetadata)}
        return cls(**base, blocks=blocks)


class ImageBlockAttention(AttentionBackend):
    """A backend's attention, with the image blocks of ImageBlockMetadata opened."""

    native_decoder_stack = False  # the native stack would attend causally only

    def __init__(self, inner: AttentionBackend) -> None:
        self.inner = inner
        self.name = inner.name
        self.batch_invariant = inner.batch_invariant

    def forward(
        self,
        query: torch.Tensor,  # [num_tokens, num_heads, head_size]
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        sliding_window: int = 0,
        logit_softcap: float = 0.0,
    ) -> torch.Tensor:
        options: dict[str, Any] = {}  # only what is set: the inner backend may lack one
        if sliding_window:
            options["sliding_window"] = sliding_window
        if logit_softcap:
            options["logit_softcap"] = logit_softcap
        out = self.inner.forward(query, key, value, kv_cache, meta, scale, **options)
        if not isinstance(meta, ImageBlockMetadata):
            return out
        for block in meta.blocks:
            rows = slice(block.row, block.row + block.end - block.first)
            page_row = meta.page_table[block.request]
            out[rows] = attend_block(query[rows], kv_cache, page_row, block, scale,
                                     sliding_window, logit_softcap)  # fmt: skip
        return out


def attend_block(
    query: torch.Tensor,  # [end - first, num_heads, head_size]
    kv_cache: torch.Tensor,
    page_row: torch.Tensor,  # the request's page-table row
    block: ImageBlock,
    scale: float,
    sliding_window: int,
    logit_softcap: float,
) -> torch.Tensor:  # [end - first, num_heads, head_size], query's dtype
    """The image rows' attention over keys [0, end), in fp32: every key up to the image's
    end is visible to them (the earlier ones causally, the image's own both ways), less
    what a sliding window hides."""
    k, v = gather_kv(kv_cache, page_row, block.end)
    q_pos = torch.arange(block.first, block.end, device=query.device)[:, None]
    k_pos = torch.arange(block.end, device=query.device)[None, :]
    hidden = (q_pos - k_pos >= sliding_window) if sliding_window > 0 else q_pos < 0
    return masked_attention(query, k, v, hidden.expand(-1, block.end), scale, logit_softcap)
