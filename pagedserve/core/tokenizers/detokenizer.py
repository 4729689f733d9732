"""Incremental detokenization: token ids in, text that is safe to show out, stop strings caught.

Each step decodes only a short window of ids: `decode(ids[prefix:])` minus `decode(ids[prefix:read])`
gives the new text with the context the tokenizer needs (sentencepiece's leading space depends on
the previous piece; a UTF-8 character may span several byte-fallback tokens). Text that ends in
an unfinished character (U+FFFD) waits for the next token. Text that could still grow into a stop
string waits too, so a stop string split across tokens is caught and never shown.
"""

from __future__ import annotations

from collections.abc import Sequence

from pagedserve.core.tokenizers.load import Tokenizer

# Prompt tokens to seed the window with, so the first output token decodes in context.
_PROMPT_CONTEXT = 6
_REPLACEMENT = "\ufffd"
# One UTF-8 character is at most 4 byte tokens (a few more with special tokens in between).
_MAX_CHAR_TOKENS = 8


class IncrementalDetokenizer:
    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        stop: Sequence[str] = (),
        include_stop_str_in_output: bool = False,
        skip_special_tokens: bool = True,
        prompt_token_ids: Sequence[int] = (),
    ) -> None:
        if any(not s for s in stop):
            raise ValueError("stop: stop strings must be non-empty")
        self._tokenizer = tokenizer
        self._stop = tuple(stop)
        self._include_stop = include_stop_str_in_output
        self._skip_special = skip_special_tokens
        # Invariant: ids[_prefix:_read] decodes to _prefix_text, all of it already released.
        self._ids, self._read, self._prefix_text = self._seed(prompt_token_ids)
        self._prefix = 0
        self._held = ""  # decoded, but could still be the start of a stop string
        self._max_hold = max((len(s) for s in self._stop), default=1) - 1
        self.stop_hit: str | None = None
        self.text = ""

    def _seed(self, prompt: Sequence[int]) -> tuple[list[int], int, str]:
        """The window's first ids, taken from the prompt's end, starting and ending on whole
        characters. A prompt ending inside a UTF-8 character leaves its last bytes unread, so
        the character shows whole once the model finishes it."""
        start = max(len(prompt) - _PROMPT_CONTEXT, 0)
        lowest = max(start - _MAX_CHAR_TOKENS, 0)
        while start > lowest and self._decode(prompt[start:]).startswith(_REPLACEMENT):
            start -= 1
        ids = list(prompt[start:])
        read, text = len(ids), self._decode(ids)
        while read > 0 and text.endswith(_REPLACEMENT):
            read -= 1
            text = self._decode(ids[:read])
        return ids, read, text

    def add(self, token_ids: Sequence[int]) -> str:
        """New text that is safe to emit now ("" once a stop string has matched)."""
        if self.stop_hit is not None or not token_ids:
            return ""
        self._ids.extend(token_ids)
        new_text = self._new_text(final=False)
        if new_text is None:
            return ""
        return self._release(self._held + new_text, final=False)

    def flush(self) -> str:
        """Release everything held back; call when the output ends for another reason."""
        if self.stop_hit is not None:
            return ""
        return self._release(self._held + (self._new_text(final=True) or ""), final=True)

    def _new_text(self, final: bool) -> str | None:
        """Text the ids added since the last call stand for; None while a UTF-8 character is
        unfinished (the window ends in U+FFFD and more bytes may come)."""
        window = self._decode(self._ids[self._prefix :])
        if window.endswith(_REPLACEMENT) and not final:
            return None
        new_text = window[len(self._prefix_text) :]
        # The next window starts where this one's new ids began: enough context, still short.
        self._prefix, self._read = self._read, len(self._ids)
        self._prefix_text = self._decode(self._ids[self._prefix : self._read])
        return new_text

    def _release(self, pending: str, final: bool) -> str:
        out, self._held = pending, ""
        match = self._find_stop(pending)
        if match is not None:
            start, stop = match
            self.stop_hit = stop
            out = pending[: start + len(stop)] if self._include_stop else pending[:start]
        elif not final and self._stop:
            keep = self._stop_prefix_len(pending)
            out, self._held = pending[: len(pending) - keep], pending[len(pending) - keep :]
        self.text += out
        return out

    def _find_stop(self, pending: str) -> tuple[int, str] | None:
        """The stop string that completes first in `pending` (earliest end, then longest):
        the one a token-by-token stream would have seen first."""
        best: tuple[int, int, str] | None = None
        for stop in self._stop:
            start = pending.find(stop)
            if start >= 0:
                key = (start + len(stop), -len(stop), stop)
                best = key if best is None or key < best else best
        return None if best is None else (best[0] - len(best[2]), best[2])

    def _stop_prefix_len(self, pending: str) -> int:
        """Length of the longest suffix of `pending` that is a proper prefix of a stop string."""
        for size in range(min(self._max_hold, len(pending)), 0, -1):
            tail = pending[-size:]
            if any(stop.startswith(tail) for stop in self._stop):
                return size
        return 0

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special) if ids else ""
