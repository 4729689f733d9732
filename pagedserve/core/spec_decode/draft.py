"""The draft model (--speculative-method draft): a small model of the target's tokenizer, in the
same process, with its own paged KV cache, proposing by greedy decoding.

Each sequence's draft KV holds the tokens it was last fed. Before proposing, the longest prefix
those share with the sequence's tokens now is kept and the rest is dropped (pages past it back
to the pool): that is the roll-back after a rejection, and the catch-up after a preemption,
without any message from the scheduler. Then one batched forward over every sequence's new
tokens (a chunk, like a prefill) gives each its first draft token, and k - 1 single-token
forwards the rest. Greedy drafts are a function of the sequence (one-hot proposals), so the
target's accept-while-equal rule (verify.py) stays exact. Owned by the model runner (tensors).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from pagedserve.core.attention.base import AttentionMetadata, kv_cache_shape
from pagedserve.core.config import EngineConfig
from pagedserve.core.device_policy import load_for_engine
from pagedserve.core.models.base import CausalLM
from pagedserve.core.models.resolve import resolve_model
from pagedserve.core.ops.native import core as _native
from pagedserve.core.tokenizers.load import Tokenizer, load_tokenizer


@dataclass
class _DraftSeq:
    tokens: list[int] = field(default_factory=list)
    """The tokens whose KV is in `pages`, in order."""
    pages: list[int] = field(default_factory=list)


@dataclass
class _Row:
    seq_id: int
    start: int
    """Position of the row's first new token."""
    new: list[int]
    """Tokens to feed now."""
    wanted: int
    drafts: list[int] = field(default_factory=list)


class DraftModel:
    def __init__(
        self,
        model: CausalLM,
        *,
        num_pages: int,
        page_size: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.model = model
        self.page_size = page_size
        self.device = device
        arch = model.arch
        shape = kv_cache_shape(num_pages, page_size, arch.num_kv_heads, arch.head_size)
        self.kv_caches = [
            torch.zeros(shape, dtype=dtype, device=device) for _ in range(arch.num_layers)
        ]
        self._pool = _native.PageAllocator(num_pages, page_size, False)
        self._seqs: dict[int, _DraftSeq] = {}

    def release(self, seq_id: int) -> None:
        seq = self._seqs.pop(seq_id, None)
        if seq is not None:
            for page in seq.pages:
                self._pool.release(page)

    @torch.inference_mode()
    def propose(self, requests: list[tuple[int, list[int], int]]) -> dict[int, list[int]]:
        """(seq_id, prompt + output tokens, k) -> up to k greedy draft tokens each (fewer, or
        none, where the draft pool is out of pages)."""
        rows = [r for r in (self._row(*request) for request in requests) if r is not None]
        drafts = {row.seq_id: row.drafts for row in rows}
        while rows:
            last = self._forward(rows)
            for row, token in zip(rows, last, strict=True):
                self._seqs[row.seq_id].tokens.extend(row.new)
                row.drafts.append(token)
                row.start += len(row.new)
                row.new = [token]
            rows = [row for row in rows if len(row.drafts) < row.wanted]
        return drafts

    def _row(self, seq_id: int, tokens: list[int], k: int) -> _Row | None:
        seq = self._seqs.setdefault(seq_id, _DraftSeq())
        keep = _common_prefix(seq.tokens, tokens)
        keep = min(keep, len(tokens) - 1)  # the last token is fed now: its logits propose
        del seq.tokens[keep:]
        self._trim(seq, keep)
        # KV for every token fed: the new ones now, then k - 1 drafts.
        if not self._grow(seq, len(tokens) + k - 1):
            self.release(seq_id)
            return None
        return _Row(seq_id, keep, tokens[keep:], k)

    def _trim(self, seq: _DraftSeq, num_tokens: int) -> None:
        keep = -(-num_tokens // self.page_size)
        while len(seq.pages) > keep:
            self._pool.release(seq.pages.pop())

    def _grow(self, seq: _DraftSeq, num_tokens: int) -> bool:
        need = -(-num_tokens // self.page_size) - len(seq.pages)
        if need <= 0:
            return True
        pages = self._pool.allocate(need)
        if pages is None:
            return False
        seq.pages.extend(pages)
        return True

    def _forward(self, rows: list[_Row]) -> list[int]:
        """Feed each row's new tokens; the greedy token after each row's last one."""
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        starts = [0]
        width = max(len(self._seqs[r.seq_id].pages) for r in rows)
        table = np.zeros((len(rows), width), dtype=np.int32)
        for i, row in enumerate(rows):
            pages = self._seqs[row.seq_id].pages
            table[i, : len(pages)] = pages
            for j, token in enumerate(row.new):
                position = row.start + j
                ids.append(token)
                positions.append(position)
                page = pages[position // self.page_size]
                slots.append(page * self.page_size + position % self.page_size)
            starts.append(len(ids))
        seq_lens = [r.start + len(r.new) for r in rows]
        meta = AttentionMetadata(
            slot_mapping=self._tensor(slots, torch.long),
            page_table=torch.from_numpy(table).to(self.device),
            seq_lens=self._tensor(seq_lens, torch.int32),
            query_start_loc=self._tensor(starts, torch.int32),
            max_query_len=max(len(r.new) for r in rows),
            max_seq_len=max(seq_lens),
        )
        hidden = self.model(
            self._tensor(ids, torch.long), self._tensor(positions, torch.long), self.kv_caches, meta
        )
        last = self._tensor([s - 1 for s in starts[1:]], torch.long)
        logits = self.model.compute_logits(hidden.index_select(0, last))
        return [int(t) for t in logits.argmax(dim=-1).tolist()]

    def _tensor(self, values: list[int], dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=self.device)


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    i = 0
    while a[i] == b[i]:
        i += 1
    return i


def build_draft_model(
    config: EngineConfig,
    tokenizer: Tokenizer,
    dtype: torch.dtype,
    device: torch.device,
    num_pages: int,
) -> DraftModel:
    """--speculative-model, loaded as the target is (dtype, device, kernels), with a KV pool of
    the target's number of pages; ValueError when its vocabulary is not the target's."""
    path = config.speculative.speculative_model
    assert path, "SpeculativeConfig checks that draft has a model"
    resolved = resolve_model(path)
    draft_vocab = load_tokenizer(resolved.path).vocab_size
    if draft_vocab != tokenizer.vocab_size:
        raise ValueError(
            f"speculative_model: {resolved.name} has {draft_vocab} tokens, the target "
            f"{tokenizer.vocab_size}: a draft model needs the target's tokenizer"
        )
    model, _arch, _weights = load_for_engine(config, resolved, dtype, device)
    page_size = config.cache.page_size
    return DraftModel(model, num_pages=num_pages, page_size=page_size, dtype=dtype, device=device)
