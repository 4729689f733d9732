"""One sequence's place in its grammar: a matcher advanced once per accepted token.

A preempted sequence keeps its output tokens when it is recomputed, and so keeps its matcher:
the state always equals "every output token accepted", whatever the scheduler did.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
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

    @property
    def terminated(self) -> bool:
        return bool(self.matcher.is_terminated())
