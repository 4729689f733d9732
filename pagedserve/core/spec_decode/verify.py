"""The model runner's side of a verification chunk: which logits entries belong to it, what
each one samples as, and how many drafts the samples keep.

A row with d drafts has d + 1 logits entries, one per position from its last known token on.
Entry j samples exactly as a decode step would after the sequence had produced drafts[:j]
(its penalties, min_tokens, grammar and seeded generator see that history), so its token is
the one the target would emit there. The drafts are kept while they equal those samples, and
the sample after the last kept draft is the target's own next token: for proposals that are
a function of the sequence (one-hot), this is the rejection-sampling rule itself (accept draft
t with probability p(t); else a token from p without t, renormalized), so the output has the
target's distribution, and greedy keeps its very tokens. No torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from pagedserve.core.sched.scheduler import StepPlan


@dataclass(frozen=True)
class Verification:
    """The verification chunks of one step (None from `verification` when it has none)."""

    prefixes: list[list[int]]
    """Per logits entry (plan.sample_seq_ids order): the drafts before its position."""
    groups: list[tuple[int, int, int]]
    """(plan row, first logits entry, number of drafts) of every row with drafts."""


def verification(plan: StepPlan) -> Verification | None:
    drafts = plan.num_draft_tokens
    if not drafts.any():
        return None
    num_draft = drafts.tolist()
    ends = plan.query_start_loc.tolist()
    logits = plan.logits_indices.tolist()
    input_ids = plan.input_ids
    prefixes: list[list[int]] = [[] for _ in logits]
    groups = []
    k = 0
    for row, d in enumerate(num_draft):
        last = k + d
        if last >= len(logits) or logits[last] != ends[row + 1] - 1:
            continue  # a prefill chunk that does not reach its end: no logits
        if d:
            tokens = input_ids[ends[row + 1] - d : ends[row + 1]].tolist()
            for j in range(1, d + 1):
                prefixes[k + j] = tokens[:j]
            groups.append((row, k, d))
        k = last + 1
    return Verification(prefixes, groups)


def num_accepted(plan: StepPlan, v: Verification, token_ids: np.ndarray) -> np.ndarray:
    """Per plan row, the drafts kept: while the sample at each draft's position equals it."""
    accepted = np.zeros(plan.num_reqs, dtype=np.int32)
    sampled = token_ids.tolist()
    ends = plan.query_start_loc
    for row, first, d in v.groups:
        drafts = plan.input_ids[int(ends[row + 1]) - d : int(ends[row + 1])].tolist()
        a = 0
        while a < d and sampled[first + a] == drafts[a]:
            a += 1
        accepted[row] = a
    return accepted
