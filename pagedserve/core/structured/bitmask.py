"""One pass per step over every constrained row: fill their bitmasks, then -inf what the
grammars forbid. Rows without a grammar are not touched."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from pagedserve.core.structured.state import GrammarState

if TYPE_CHECKING:
    import xgrammar


class GrammarMasker:
    """Owns the step's bitmask buffer (int32 [rows, ceil(vocab / 32)], reused across steps)."""

    def __init__(self) -> None:
        self._buffer: torch.Tensor | None = None
        self._batch: xgrammar.BatchGrammarMatcher | None = None

    def apply(
        self,
        logits: torch.Tensor,
        rows: list[int],
        states: list[GrammarState],
        prefixes: Sequence[Sequence[int]] = (),
    ) -> None:
        """Mask logits [N, vocab] (float32, contiguous) in place at `rows`; `prefixes`
        (aligned, optional): tokens a row's grammar takes as produced first (speculative
        decoding's drafts), accepted for its fill and rolled back after."""
        import xgrammar

        num_rows, vocab_size = logits.shape
        bitmask = self._bitmask(num_rows, vocab_size)
        if self._batch is None:
            # One thread: 32 rows fill in ~0.07 ms here, and a second thread doubled that
            # (bench/RESULTS.md); the apply over [rows, vocab] is the larger cost.
            self._batch = xgrammar.BatchGrammarMatcher(max_threads=1)
        ahead = [i for i, p in enumerate(prefixes) if p]
        plain = [i for i in range(len(rows)) if not (prefixes and prefixes[i])]
        if plain:
            matchers = [states[i].matcher for i in plain]
            self._batch.batch_fill_next_token_bitmask(matchers, bitmask, [rows[i] for i in plain])
        for i in ahead:
            states[i].fill_after(prefixes[i], bitmask, rows[i])
        if bitmask.device != logits.device:
            bitmask = bitmask.to(logits.device, non_blocking=True)
        xgrammar.apply_token_bitmask_inplace(logits, bitmask, vocab_size=vocab_size, indices=rows)

    def _bitmask(self, num_rows: int, vocab_size: int) -> torch.Tensor:
        words = (vocab_size + 31) // 32
        buffer = self._buffer
        if buffer is None or buffer.shape[0] < num_rows or buffer.shape[1] != words:
            buffer = torch.full((max(num_rows, 64), words), -1, dtype=torch.int32)
            self._buffer = buffer
        return buffer[:num_rows]
