"""The slow, obvious torch reference for the paged-attention ops: the oracle for every kernel.

Gather each request's pages into a dense [seq_len, num_kv_heads, head_size] tensor, then do
plain causal attention in fp32. Written for clarity, not speed.

Per-layer options, as Hugging Face defines them (transformers' masking_utils and Gemma 2):
- sliding_window w > 0: the query at position i sees key j iff j <= i and i - j < w.
- logit_softcap c > 0: scores = c * tanh(scores / c), after the scale, before the mask.
"""

from __future__ import annotations

import torch

from pagedserve.core.attention.base import (
    KV_8BIT,
    KV_SCALE_BYTES,
    AttentionBackend,
    AttentionMetadata,
    kv_head_size,
)


def quantize_rows(x: torch.Tensor, dtype: torch.dtype = torch.int8) -> torch.Tensor:
    """Rows [..., head_size] as an 8-bit cache of `dtype` stores them (attention/base.py's
    layout): [..., head_size + KV_SCALE_BYTES], the values then their float32 scale's bytes.
    int8: scale max|x| / 127, values rounded half to even; float8_e4m3fn: scale max|x| / 448,
    values torch's e4m3 rounding (to nearest even, saturating). The kernels' cache write
    quantizes the same way, to the bit."""
    x = x.float()
    if dtype == torch.int8:
        scale = x.abs().amax(dim=-1, keepdim=True) / 127
        q = torch.where(scale > 0, torch.round(x / scale), 0.0).clamp(-127, 127).to(dtype)
    else:
        scale = x.abs().amax(dim=-1, keepdim=True) / 448
        q = torch.where(scale > 0, x / scale, 0.0).to(dtype)
    return torch.cat([q, scale.contiguous().view(dtype)], dim=-1)


def dequantize_rows(rows: torch.Tensor) -> torch.Tensor:
    """quantize_rows' output back to fp32 [..., head_size]: values times their row's scale."""
    scale = rows[..., -KV_SCALE_BYTES:].contiguous().view(torch.float32)
    return rows[..., :-KV_SCALE_BYTES].float() * scale


def reshape_and_cache_reference(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_size]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_size]
    kv_cache: torch.Tensor,  # [2, num_pages, num_kv_heads, page_size, row_size]
    slot_mapping: torch.Tensor,  # [num_tokens] int64, -1 = skip
) -> None:
    page_size = kv_cache.shape[3]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    pages, offsets = slots // page_size, slots % page_size
    for half, rows in enumerate((key[keep], value[keep])):
        dtype = kv_cache.dtype
        stored = quantize_rows(rows, dtype) if dtype in KV_8BIT else rows.to(dtype)
        kv_cache[half, pages, :, offsets] = stored


def gather_kv(
    kv_cache: torch.Tensor, page_row: torch.Tensor, seq_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The first seq_len keys and values of one request: two [seq_len, num_kv_heads, head_size]
    (an 8-bit cache's dequantized to fp32)."""
    page_size = kv_cache.shape[3]
    num_pages = (seq_len + page_size - 1) // page_size
    pages = page_row[:num_pages].long()
    # [2, n, kv_heads, page_size, row] -> [2, n * page_size, kv_heads, row]
    kv = (
        kv_cache[:, pages]
        .transpose(2, 3)
        .reshape(2, num_pages * page_size, *kv_cache.shape[2:3], -1)
    )
    if kv_cache.dtype in KV_8BIT:
        kv = dequantize_rows(kv)
    assert kv.shape[-1] == kv_head_size(kv_cache)
    return kv[0, :seq_len], kv[1, :seq_len]


def paged_attention_reference(
    query: torch.Tensor,  # [num_tokens, num_heads, head_size]
    kv_cache: torch.Tensor,
    page_table: torch.Tensor,  # [num_reqs, max_pages] int32
    seq_lens: torch.Tensor,  # [num_reqs] int32
    query_start_loc: torch.Tensor,  # [num_reqs + 1] int32
    scale: float,
    sliding_window: int = 0,  # 0: none
    logit_softcap: float = 0.0,  # 0: none
) -> torch.Tensor:  # [num_tokens, num_heads, head_size], query's dtype
    out = torch.empty_like(query)
    for r in range(seq_lens.shape[0]):
        start, end = int(query_start_loc[r]), int(query_start_loc[r + 1])
        seq_len, q_len = int(seq_lens[r]), end - start
        if q_len == 0:
            continue
        k, v = gather_kv(kv_cache, page_table[r], seq_len)
        q_pos = torch.arange(seq_len - q_len, seq_len, device=query.device)[:, None]
        k_pos = torch.arange(seq_len, device=query.device)[None, :]
        hidden = k_pos > q_pos
        if sliding_window > 0:
            hidden |= q_pos - k_pos >= sliding_window
        out[start:end] = masked_attention(query[start:end], k, v, hidden, scale, logit_softcap)
    return out


def masked_attention(
    query: torch.Tensor,  # [q_len, num_heads, head_size]
    k: torch.Tensor,  # [k_len, num_kv_heads, head_size]
    v: torch.Tensor,
    hidden: torch.Tensor,  # [q_len, k_len] bool: True where a query may not see a key
    scale: float,
    logit_softcap: float,
) -> torch.Tensor:  # [q_len, num_heads, head_size], query's dtype
    """Attention in fp32 with an explicit mask: the reference's causal one, or Gemma 3's
    image blocks (attention/image_blocks.py)."""
    group = query.shape[1] // k.shape[1]
    k = k.float().repeat_interleave(group, dim=1)  # [k_len, num_heads, d]
    v = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", query.float(), k) * scale
    if logit_softcap > 0:
        scores = torch.tanh(scores / logit_softcap) * logit_softcap
    probs = torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, v).to(query.dtype)


class TorchReferenceBackend(AttentionBackend):
    """Attention through the reference ops: slow, for tests and as a last-resort fallback."""

    name = "torch"
    batch_invariant = False

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        sliding_window: int = 0,
        logit_softcap: float = 0.0,
    ) -> torch.Tensor:
        reshape_and_cache_reference(key, value, kv_cache, meta.slot_mapping)
        return paged_attention_reference(
            query,
            kv_cache,
            meta.page_table,
            meta.seq_lens,
            meta.query_start_loc,
            scale,
            sliding_window,
            logit_softcap,
        )
