"""Drive pagedserve models through the paged KV cache the way the model runner will, with a
hand-built page table, so model tests need no scheduler."""

from __future__ import annotations

import torch

from pagedserve.core.attention.base import AttentionMetadata, kv_cache_shape
from pagedserve.core.models.arch import ArchConfig


def kv_caches_for(arch: ArchConfig, num_pages: int, page_size: int, dtype: torch.dtype):
    shape = kv_cache_shape(num_pages, page_size, arch.num_kv_heads, arch.head_size)
    return [torch.zeros(shape, dtype=dtype) for _ in range(arch.num_layers)]


class PagedBatch:
    """Requests with fixed, non-contiguous page tables (request r owns pages r, r + R, ...,
    in reverse order) so that page-table lookups are really exercised."""

    def __init__(
        self,
        model,
        arch: ArchConfig,
        *,
        num_reqs: int = 1,
        page_size: int = 4,
        max_len: int = 128,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        self.model, self.page_size = model, page_size
        pages_per_req = -(-max_len // page_size)
        pages = torch.arange(num_reqs * pages_per_req).view(pages_per_req, num_reqs).T
        # Rebuilt from a list: a [1, n] view can carry stride(0) == 1, which kernels reading
        # stride(0) as the row pitch would misread.
        self.page_table = torch.tensor(pages.flip(1).tolist(), dtype=torch.int32)
        self.kv_caches = kv_caches_for(arch, num_reqs * pages_per_req, page_size, dtype)
        self.seq_lens = [0] * num_reqs

    def step(self, token_ids: list[list[int]]) -> torch.Tensor:
        """Feed token_ids[r] to request r (one flat batch); returns fp32 logits of every row."""
        ids, positions, slots, starts = [], [], [], [0]
        for r, toks in enumerate(token_ids):
            pos = torch.arange(self.seq_lens[r], self.seq_lens[r] + len(toks))
            page = self.page_table[r, pos // self.page_size].long()
            slots.append(page * self.page_size + pos % self.page_size)
            ids.extend(toks)
            positions.append(pos)
            starts.append(starts[-1] + len(toks))
            self.seq_lens[r] += len(toks)
        meta = AttentionMetadata(
            slot_mapping=torch.cat(slots),
            page_table=self.page_table,
            seq_lens=torch.tensor(self.seq_lens, dtype=torch.int32),
            query_start_loc=torch.tensor(starts, dtype=torch.int32),
            max_query_len=max(len(t) for t in token_ids),
            max_seq_len=max(self.seq_lens),
        )
        with torch.inference_mode():
            hidden = self.model(torch.tensor(ids), torch.cat(positions), self.kv_caches, meta)
            return self.model.compute_logits(hidden)


def greedy_generate(model, arch: ArchConfig, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Prefill the prompt, then decode one token at a time, always taking the argmax."""
    batch = PagedBatch(model, arch, max_len=len(prompt) + max_new_tokens)
    logits = batch.step([prompt])[-1]
    out = [int(logits.argmax())]
    while len(out) < max_new_tokens:
        out.append(int(batch.step([[out[-1]]])[-1].argmax()))
    return out
