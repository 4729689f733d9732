"""One sequence's place in its grammar: a matcher advanced once per accepted token.

A preempted sequence keeps its output tokens when it is recomputed, and so keeps its matcher:
the state always equals "every output token accepted", whatever the scheduler did.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    # Re-exported for core.request, which names it only for types (it stays stdlib-only).
    from xgrammar import CompiledGrammar as CompiledGrammar
    from xgrammar import GrammarMatcher

logger = logging.getLogger(__name__)


class GrammarState:
    def __init__(self, compiled: CompiledGrammar) -> None:
        import xgrammar

        self.matcher: GrammarMatcher = xgrammar.GrammarMatcher(compiled)

    def advance(self, token_id: int) -> bool:
        """Accept the sampled token; True when the grammar has ended (it accepted a stop token,
        or refused the token, which the mask makes impossible: logged, and the output ends)."""
        if not self.matcher.accept_token(token_id):
            logger.error("grammar refused sampled token %d; ending the output", token_id)
            return True
        return bool(self.matcher.is_terminated())

    def valid_prefix(self, token_ids: Sequence[int]) -> int:
        """How many of token_ids, in order from here, the grammar would accept (stopping where
        it ends); the state is left as it was."""
        matcher = self.matcher
        n = 0
        for token in token_ids:
            if matcher.is_terminated() or not matcher.accept_token(token):
                break
            n += 1
        if n:
            matcher.rollback(n)
        return n

    def fill_after(self, token_ids: Sequence[int], bitmask: torch.Tensor, row: int) -> None:
        """bitmask[row]: the tokens allowed after token_ids (which it accepts, as
        valid_prefix checked); the state is left as it was."""
        matcher = self.matcher
        taken = 0
        for token in token_ids:
            if not matcher.accept_token(token):
                break
            taken += 1
        matcher.fill_next_token_bitmask(bitmask, row)
        if taken:
            matcher.rollback(taken)

    @property
    def terminated(self) -> bool:
        return bool(self.matcher.is_terminated())
