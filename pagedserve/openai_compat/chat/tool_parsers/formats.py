"""The tool-call formats: Hermes/Qwen `<tool_call>`, Llama 3 JSON, Mistral `[TOOL_CALLS]`, and
the two that pagedserve's own grammars produce (`required`: a JSON array of calls; a named
function: its arguments object alone)."""

from __future__ import annotations

import re

from pagedserve.openai_compat.chat.tool_parsers.base import CallStreamer, ParsedDelta, held_prefix
from pagedserve.openai_compat.chat.tool_parsers.stream import ArrayBody, CharParser, ObjectsBody


class HermesParser(CharParser):
    """Text, then `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks (Hermes,
    Qwen 2.5/3, and pagedserve's fallback prompt for templates without tools)."""

    START, END = "<tool_call>", "</tool_call>"

    def __init__(self) -> None:
        super().__init__()
        self._mode = "text"  # text, call, after
        self._held = ""
        self._call: CallStreamer | None = None

    def char(self, ch: str, out: ParsedDelta) -> None:
        if self._mode == "call":
            return self._call_char(ch, out)
        self._held += ch
        if self._mode == "after":
            return self._after(out)
        if self.START in self._held:
            before, _, rest = self._held.partition(self.START)
            self.content(before, out)
            self._held, self._mode = "", "call"
            self._call = CallStreamer(self.num_calls)
            for c in rest:
                self.char(c, out)
            return None
        keep = held_prefix(self._held, (self.START,))
        self.content(self._held[: len(self._held) - keep], out)
        self._held = self._held[len(self._held) - keep :]
        return None

    def _call_char(self, ch: str, out: ParsedDelta) -> None:
        assert self._call is not None
        self.calls(self._call.feed(ch), out)
        scanner = self._call.scanner
        if scanner.failed:
            if not self._call.announced:
                self.content(self.START + scanner.text, out)
            self._mode = "text"
        elif scanner.done:
            self.calls(self._call.pull(final=True), out)
            self._mode, self._held = "after", ""

    def _after(self, out: ParsedDelta) -> None:
        stripped = self._held.lstrip()
        if stripped.startswith(self.END):
            rest = stripped[len(self.END) :]
            self._held, self._mode = "", "text"
            self.feed_into(rest, out)
        elif not self.END.startswith(stripped):
            rest, self._held, self._mode = self._held, "", "text"
            self.feed_into(rest, out)

    def feed_into(self, text: str, out: ParsedDelta) -> None:
        for c in text:
            self.char(c, out)

    def end(self, out: ParsedDelta) -> None:
        if self._mode == "call" and self._call is not None:
            self.calls(self._call.pull(final=True), out)
            if not self._call.announced:
                self.content(self.START + self._call.scanner.text, out)
        elif self._mode == "text":
            self.content(self._held, out)
        self._held = ""


class Llama3JsonParser(CharParser):
    """Llama 3.x: the whole output is `{"name": ..., "parameters": {...}}` (optionally after
    `<|python_tag|>`, several separated by `;`); anything else is content."""

    PYTHON_TAG = "<|python_tag|>"
    _OPEN = '{"name"'

    def __init__(self) -> None:
        super().__init__()
        self._mode = "start"  # start, calls, text
        self._held = ""
        self._body = ObjectsBody(self, ";")

    def char(self, ch: str, out: ParsedDelta) -> None:
        if self._mode == "text":
            return self.content(ch, out)
        if self._mode == "calls":
            self._body.char(ch, out)
            if self._body.failed and not self.num_calls:
                self._mode = "text"
                self.content(self._body.raw, out)
            return None
        self._held += ch
        return self._decide(out)

    def _decide(self, out: ParsedDelta) -> None:
        text = self._held.lstrip()
        if text.startswith(self.PYTHON_TAG):
            text = text[len(self.PYTHON_TAG) :].lstrip()
        elif self.PYTHON_TAG.startswith(text):
            return
        compact = re.sub(r"\s+", "", text)
        if compact.startswith(self._OPEN):
            self._mode = "calls"
            for c in text:
                self.char(c, out)
        elif not self._OPEN.startswith(compact):
            self._mode = "text"
            self.content(self._held, out)

    def end(self, out: ParsedDelta) -> None:
        if self._mode == "start":
            self.content(self._held, out)
        elif self._mode == "calls":
            self._body.end(out)


class MistralParser(CharParser):
    """Text, then `[TOOL_CALLS]` followed by a JSON array of calls (v3 tokenizers) or by
    `name[ARGS]{...}` (v11+), possibly repeated."""

    START, ARGS = "[TOOL_CALLS]", "[ARGS]"

    def __init__(self) -> None:
        super().__init__()
        self._mode = "text"  # text, body, array, name, args
        self._held = ""
        self._array: ArrayBody | None = None
        self._call: CallStreamer | None = None

    def char(self, ch: str, out: ParsedDelta) -> None:
        mode = self._mode
        if mode == "array":
            return self._array_char(ch, out)
        if mode == "args":
            return self._args_char(ch, out)
        self._held += ch
        if mode == "text":
            return self._text(out)
        if mode == "body" and not ch.isspace():
            self._held = ""
            if ch == "[":
                self._array, self._mode = ArrayBody(self), "array"
                return self._array_char(ch, out)
            self._mode, self._held = "name", ch
            return None
        if mode == "name" and self._held.endswith(self.ARGS):
            name = self._held[: -len(self.ARGS)].strip()
            self._call, self._mode, self._held = CallStreamer(self.num_calls, name), "args", ""
        return None

    def _text(self, out: ParsedDelta) -> None:
        if self.START in self._held:
            before, _, rest = self._held.partition(self.START)
            self.content(before, out)
            self._held, self._mode = "", "body"
            for c in rest:
                self.char(c, out)
            return
        keep = held_prefix(self._held, (self.START,))
        self.content(self._held[: len(self._held) - keep], out)
        self._held = self._held[len(self._held) - keep :]

    def _array_char(self, ch: str, out: ParsedDelta) -> None:
        assert self._array is not None
        self._array.char(ch, out)
        if self._array.done or self._array.failed:
            self._mode = "text"

    def _args_char(self, ch: str, out: ParsedDelta) -> None:
        assert self._call is not None
        if not self._call.scanner.text and ch.isspace():
            return
        self.calls(self._call.feed(ch), out)
        if self._call.scanner.done or self._call.scanner.failed:
            self.calls(self._call.pull(final=True), out)
            self._mode = "text"

    def end(self, out: ParsedDelta) -> None:
        if self._mode == "array" and self._array is not None:
            self._array.end(out)
        elif self._mode == "args" and self._call is not None:
            self.calls(self._call.pull(final=True), out)
        elif self._mode == "text":
            self.content(self._held, out)


class RequiredParser(CharParser):
    """pagedserve's grammar for tool_choice "required": `[{"name": ..., "parameters": ...}]`."""

    def __init__(self) -> None:
        super().__init__()
        self._array = ArrayBody(self)

    def char(self, ch: str, out: ParsedDelta) -> None:
        if not (self._array.done or self._array.failed):
            self._array.char(ch, out)

    def end(self, out: ParsedDelta) -> None:
        self._array.end(out)


class NamedParser(CharParser):
    """tool_choice naming one function: the grammar makes the whole output its arguments."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self._call = CallStreamer(0, name)

    def char(self, ch: str, out: ParsedDelta) -> None:
        if not (self._call.scanner.done or self._call.scanner.failed):
            self.calls(self._call.feed(ch), out)

    def end(self, out: ParsedDelta) -> None:
        self.calls(self._call.pull(final=True), out)
