"""Constrained decoding: grammars compiled by xgrammar, one matcher per sequence, token bitmasks
applied inside the batched sampler.

- `compiler.py`: the vocabulary handed to xgrammar (from our tokenizer) and an LRU of compiled
  grammars keyed by the constraint; compiling is thread-safe so the server runs it off the loop.
- `state.py`: one sequence's matcher, advanced once per accepted token.
- `bitmask.py`: one pass per step that fills and applies the masks of every constrained row.

xgrammar (and through it transformers) is imported only when a constraint is first compiled.
"""

from pagedserve.core.structured.compiler import GrammarCache, GrammarError
from pagedserve.core.structured.state import GrammarState

__all__ = ["GrammarCache", "GrammarError", "GrammarState"]
