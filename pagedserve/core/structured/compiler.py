"""StructuredOutputs -> xgrammar CompiledGrammar, through an LRU keyed by the constraint.

Every JSON grammar is compiled without free whitespace (`any_whitespace=False`: separators are
", " and ": ", no newlines). Small models, left free, tend to emit whitespace until max_tokens;
the compact form is still JSON, and the grammar stays the schema's.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from typing import TYPE_CHECKING

from pagedserve.core.sampling_params import StructuredOutputs
from pagedserve.core.tokenizers.base import Tokenizer

if TYPE_CHECKING:
    import xgrammar

logger = logging.getLogger(__name__)

DEFAULT_CAPACITY = 256
"""Compiled grammars kept (a JSON-schema grammar over a 49k vocabulary is ~0.1-1 MB)."""


class GrammarError(ValueError):
    """A constraint that cannot be compiled; `param` names the request field."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param
        self.message = message


def tokenizer_info(tokenizer: Tokenizer) -> xgrammar.TokenizerInfo:
    """Our vocabulary as raw bytes per id. Special tokens become empty strings, which xgrammar
    treats as special (never allowed inside a grammar); EOS ids end a finished grammar."""
    import xgrammar

    vocab = [
        b"" if tokenizer.is_special(i) else tokenizer.token_bytes(i)
        for i in range(tokenizer.vocab_size)
    ]
    return xgrammar.TokenizerInfo(
        vocab,
        xgrammar.VocabType.RAW,
        vocab_size=tokenizer.vocab_size,
        stop_token_ids=sorted(tokenizer.eos_token_ids),
    )


class GrammarCache:
    """Thread-safe LRU of compiled grammars; `compile` may run on any thread."""

    def __init__(self, tokenizer: Tokenizer, capacity: int = DEFAULT_CAPACITY) -> None:
        self._tokenizer = tokenizer
        self._capacity = capacity
        self._lock = threading.Lock()
        self._compiler: xgrammar.GrammarCompiler | None = None
        self._grammars: OrderedDict[tuple[str, str], xgrammar.CompiledGrammar] = OrderedDict()
        self.num_compiled = 0
        self.compile_seconds = 0.0

    def compile(self, spec: StructuredOutputs) -> xgrammar.CompiledGrammar:
        """The spec's CompiledGrammar (cached); GrammarError when it cannot be compiled."""
        with self._lock:
            found = self._grammars.get(spec.key)
            if found is not None:
                self._grammars.move_to_end(spec.key)
                return found
            compiler = self._compiler_locked()
        start = time.perf_counter()
        compiled = _compile(compiler, spec)  # outside the lock: other specs compile meanwhile
        elapsed = time.perf_counter() - start
        with self._lock:
            self.num_compiled += 1
            self.compile_seconds += elapsed
            self._grammars[spec.key] = compiled
            while len(self._grammars) > self._capacity:
                self._grammars.popitem(last=False)
        logger.debug("compiled a %s grammar in %.1f ms", spec.kind, elapsed * 1e3)
        return compiled

    def __len__(self) -> int:
        return len(self._grammars)

    def _compiler_locked(self) -> xgrammar.GrammarCompiler:
        if self._compiler is None:
            import xgrammar

            # xgrammar's own cache is off: this LRU is the one cache, bounded by count.
            self._compiler = xgrammar.GrammarCompiler(
                tokenizer_info(self._tokenizer), max_threads=2, cache_enabled=False
            )
        return self._compiler


def _compile(
    compiler: xgrammar.GrammarCompiler, spec: StructuredOutputs
) -> xgrammar.CompiledGrammar:
    try:
        if spec.kind == "json_schema":
            return compiler.compile_json_schema(spec.value, any_whitespace=False)
        if spec.kind == "json_object":
            return compiler.compile_json_schema('{"type": "object"}', any_whitespace=False)
        if spec.kind == "regex":
            return compiler.compile_regex(spec.value)
        if spec.kind == "choice":
            return compiler.compile_grammar(choice_ebnf(json.loads(spec.value)))
        return compiler.compile_grammar(spec.value)  # ebnf
    except (RuntimeError, ValueError, TypeError) as exc:
        raise GrammarError(spec.param, f"cannot be compiled into a grammar: {exc}") from exc


def choice_ebnf(choices: list[str]) -> str:
    """An EBNF grammar matching exactly one of the strings (JSON escapes are EBNF's too)."""
    if not choices or not all(isinstance(c, str) and c for c in choices):
        raise ValueError("choices must be a non-empty list of non-empty strings")
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)
