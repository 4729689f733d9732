"""The engine's side of speculative decoding: before each schedule(), a draft for every
decoding sequence that still pays (ngram.py proposes it, or the draft model, draft.py, held by
the model runner, for all of them in one batch); after each step, what the target accepted,
which tunes the next drafts and feeds /metrics. No torch.

When it pays (docs/design.md; bench/engine/spec_step_cost.py measures the costs in bench/RESULTS.md):
a step of B decoding sequences costs about (B + `STEP_ROWS`) decode rows, and each draft token
one more row of `DRAFT_ROW` decode rows. The draft token at position i (1-based) is accepted
with probability about alpha^i, alpha the sequence's recent rate of accepted draft tokens, and
then saves a token's share of the step, (B + STEP_ROWS) / B decode rows. So position i is
proposed while alpha^i >= threshold(B) = DRAFT_ROW * B / (B + STEP_ROWS): nearly always for a
single sequence, where the step's fixed cost dominates, only for well-accepted drafts in a
large batch, which is compute-bound already. A sequence whose alpha allows no draft pauses
(`_PAUSE` steps, doubled while probes keep failing, up to `_MAX_PAUSE`), then probes with one
token. No drafts at all while more than `speculative_max_batch` sequences run.
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

DRAFT_ROW = 0.55
"""A draft token's row, in decode rows (bench/engine/spec_step_cost.py, Xeon 2026-12-03: 0.5-0.6)."""
STEP_ROWS = 4.5
"""A step's fixed cost, in decode rows (the same run: 5.6 ms for 1 sequence, +1.0 ms each)."""
_PAUSE = 8
_MAX_PAUSE = 256
_DECAY = 0.8
_PRIOR_RATE, _PRIOR_WEIGHT = 0.7, 2.0  # alpha before any verification


@dataclass
class _SeqState:
    index: NgramIndex | None
    accepted: float = _PRIOR_RATE * _PRIOR_WEIGHT
    """Draft tokens accepted, recent ones weighing most (decayed counts, a prior included)."""
    tried: float = _PRIOR_WEIGHT
    """Draft tokens accepted plus verifications that rejected one (each a trial of alpha)."""
    pause: int = 0
    """Steps left without proposals."""
    next_pause: int = _PAUSE
    probing: bool = False
    """The next draft is a probe of one token after a pause."""

    @property
    def rate(self) -> float:
        return self.accepted / self.tried


def threshold(batch: int) -> float:
    """The least acceptance probability at which a draft token pays in a batch this size."""
    return DRAFT_ROW * batch / (batch + STEP_ROWS)


def draft_length(rate: float, batch: int, most: int) -> int:
    """The positions i <= most with rate^i >= threshold(batch)."""
    floor, length, p = threshold(batch), 0, rate
    while length < most and p >= floor:
        length += 1
        p *= rate
    return length


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
        wanted = [t for t in self._wanted(seqs, max(num_running, 1)) if t[2] > 0]
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

    def _wanted(
        self, seqs: Iterable[Sequence], batch: int
    ) -> Iterable[tuple[Sequence, _SeqState, int]]:
        """Each sequence that may speculate now, with its state and its most drafts."""
        most = self.config.num_speculative_tokens
        for seq in seqs:
            if not seq.output_token_ids or seq.finished or seq.request.pooling is not None:
                continue
            state = self._states.get(seq.seq_id)
            if state is None:
                state = self._states[seq.seq_id] = self._new_state(seq.request.prompt_token_ids)
            length = _length(state, batch, most)
            # Never past max_tokens: the target's own token comes after the drafts.
            room = seq.request.max_tokens - len(seq.output_token_ids) - 1
            yield seq, state, min(length, room)

    def _new_state(self, prompt_token_ids: Seq[int]) -> _SeqState:
        config = self.config
        index = None
        if self._draft_batch is None:
            index = NgramIndex(prompt_token_ids, config.ngram_min, config.ngram_max)
        return _SeqState(index)

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
        state.accepted = _DECAY * state.accepted + num_accepted
        state.tried = _DECAY * state.tried + num_accepted + (num_accepted < num_draft)
        if state.probing:
            state.probing = False
            failed = num_accepted == 0
            state.next_pause = min(2 * state.next_pause, _MAX_PAUSE) if failed else _PAUSE

    def release(self, seq_id: int) -> None:
        self._states.pop(seq_id, None)


def _length(state: _SeqState, batch: int, most: int) -> int:
    """This step's most drafts for the sequence (0: none, paused or not worth a row)."""
    if state.pause > 0:
        state.pause -= 1
        state.probing = state.pause == 0
        return 1 if state.probing else 0
    length = draft_length(state.rate, batch, most)
    if length == 0:  # not worth a row now: pause, then probe
        state.pause = state.next_pause
    return length


def _ngram(state: _SeqState, seq: Sequence, room: int) -> list[int]:
    assert state.index is not None
    return state.index.propose(seq.output_token_ids, room)
