"""The engine's side of speculative decoding: before each schedule(), a draft for every
decoding sequence that still pays (ngram.py proposes it, or the draft model, draft.py, held by
the model runner, for all of them in one batch); after each step, what the target accepted,
which tunes the next drafts and feeds /metrics. No torch.

When it pays (docs/design.md, measured in bench/RESULTS.md): a verification chunk costs the
target one row per proposed token, nearly free while a step is bound by reading the weights
(few sequences) and a real cost once the batch makes the step compute-bound. So:
- batch: no drafts at all while more than `speculative_max_batch` sequences run;
- sequence: the draft length follows acceptance (all accepted: one longer, up to
  num_speculative_tokens; else one more than were accepted); after `_MISSES` verifications in
  a row that kept nothing, the sequence pauses for `_PAUSE` steps, doubled at each further
  miss up to `_MAX_PAUSE`, then proposes a single token again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pagedserve.core.config import SpeculativeConfig
from pagedserve.core.outputs import SpecDecodeStats
from pagedserve.core.spec_decode.ngram import NgramIndex

if TYPE_CHECKING:
    from pagedserve.core.request import Sequence

DraftBatch = Callable[[list[tuple[int, list[int], int]]], dict[int, list[int]]]
"""(seq_id, prompt + output tokens, most drafts) per sequence -> its drafts (draft.py)."""

_MISSES = 3
_PAUSE = 8
_MAX_PAUSE = 256


@dataclass
class _SeqState:
    index: NgramIndex | None
    length: int
    """Draft length for the next proposal."""
    misses: int = 0
    pause: int = 0
    """Steps left without proposals."""
    next_pause: int = _PAUSE


class Speculator:
    def __init__(
        self,
        config: SpeculativeConfig,
        propose: Callable[[int, list[int]], None],
        cut: Callable[[Sequence, list[int]], list[int]] | None = None,
        draft_batch: DraftBatch | None = None,
    ) -> None:
        """`propose(seq_id, draft)`: hands a draft to the scheduler; `cut(seq, draft)`: the
        prefix its grammar accepts (structured output); `draft_batch`: the draft model's
        proposer (method draft; ngram without)."""
        assert (config.speculative_method == "draft") == (draft_batch is not None)
        self.config = config
        self._propose = propose
        self._cut = cut
        self._draft_batch = draft_batch
        self._states: dict[int, _SeqState] = {}
        self.stats = SpecDecodeStats(accepted_per_pos=[0] * config.num_speculative_tokens)

    def propose(self, seqs: Iterable[Sequence], num_running: int) -> None:
        """Drafts for the next schedule() (the scheduler uses those of decoding sequences)."""
        if num_running > self.config.speculative_max_batch:
            return
        wanted = [(seq, state, room) for seq, state, room in self._wanted(seqs) if room > 0]
        if self._draft_batch is not None:
            batch = [(s.seq_id, [*s.request.prompt_token_ids, *s.output_token_ids], room)
                     for s, _, room in wanted]  # fmt: skip
            found = self._draft_batch(batch) if batch else {}
            drafts = [(seq, found.get(seq.seq_id, [])) for seq, _, _ in wanted]
        else:
            drafts = [(seq, _ngram(state, seq, room)) for seq, state, room in wanted]
        for seq, draft in drafts:
            if draft and seq.grammar is not None and self._cut is not None:
                draft = self._cut(seq, draft)
            if draft:
                self._propose(seq.seq_id, draft)

    def _wanted(self, seqs: Iterable[Sequence]) -> Iterable[tuple[Sequence, _SeqState, int]]:
        """Each sequence that may speculate now, with its state and its most drafts."""
        for seq in seqs:
            if not seq.output_token_ids or seq.finished or seq.request.pooling is not None:
                continue
            state = self._states.get(seq.seq_id)
            if state is None:
                state = self._states[seq.seq_id] = self._new_state(seq.request.prompt_token_ids)
            if state.pause > 0:
                state.pause -= 1
                continue
            # Never past max_tokens: the target's own token comes after the drafts.
            yield (
                seq,
                state,
                min(state.length, seq.request.max_tokens - len(seq.output_token_ids) - 1),
            )

    def _new_state(self, prompt_token_ids: Seq[int]) -> _SeqState:
        config = self.config
        index = None
        if self._draft_batch is None:
            index = NgramIndex(prompt_token_ids, config.ngram_min, config.ngram_max)
        return _SeqState(index, config.num_speculative_tokens)

    def observe(self, seq_id: int, num_draft: int, num_accepted: int) -> None:
        """A verification of `num_draft` tokens kept `num_accepted` of them."""
        stats = self.stats
        stats.num_drafts += 1
        stats.num_draft_tokens += num_draft
        stats.num_accepted_tokens += num_accepted
        for i in range(min(num_accepted, len(stats.accepted_per_pos))):
            stats.accepted_per_pos[i] += 1
        state = self._states.get(seq_id)
        if state is None:
            return
        limit = self.config.num_speculative_tokens
        state.length = min(limit, num_draft + 1) if num_accepted == num_draft else num_accepted + 1
        if num_accepted > 0:
            state.misses, state.next_pause = 0, _PAUSE
            return
        state.misses += 1
        if state.misses >= _MISSES:
            state.pause, state.misses = state.next_pause, 0
            state.next_pause = min(2 * state.next_pause, _MAX_PAUSE)
            state.length = 1

    def release(self, seq_id: int) -> None:
        self._states.pop(seq_id, None)


def _ngram(state: _SeqState, seq: Sequence, room: int) -> list[int]:
    assert state.index is not None
    return state.index.propose(seq.output_token_ids, room)
