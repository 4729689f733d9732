"""The character-driven machinery the format parsers are built from.

`CharParser` keeps the content / tool-call bookkeeping (whitespace-only content is held until
real text follows, and dropped when the output turned out to be calls). Bodies:
`ArrayBody` reads `[{call}, {call}]`, `ObjectsBody` reads `{call}` items separated by a
character set (Llama 3: `;`), and a CallStreamer reads a single object.
"""

from __future__ import annotations

from abc import abstractmethod

from pagedserve.openai_compat.chat.tool_parsers.base import (
    CallStreamer,
    ParsedDelta,
    ToolCallDelta,
    ToolParser,
)


class CharParser(ToolParser):
    def __init__(self) -> None:
        self.num_calls = 0
        self._space = ""  # whitespace-only content held back

    def feed(self, text: str) -> ParsedDelta:
        out = ParsedDelta()
        for ch in text:
            self.char(ch, out)
        return out

    def finish(self) -> ParsedDelta:
        out = ParsedDelta()
        self.end(out)
        if self._space and not self.num_calls:
            out.content += self._space
        self._space = ""
        return out

    @abstractmethod
    def char(self, ch: str, out: ParsedDelta) -> None: ...

    @abstractmethod
    def end(self, out: ParsedDelta) -> None: ...

    def content(self, text: str, out: ParsedDelta) -> None:
        if not text:
            return
        if text.isspace():
            self._space += text
            return
        out.content += self._space + text
        self._space = ""

    def calls(self, deltas: list[ToolCallDelta], out: ParsedDelta) -> None:
        if deltas and deltas[0].name is not None:
            self.num_calls += 1
        out.calls.extend(deltas)


class ArrayBody:
    """`[ {call}, {call} ]` read one character at a time; `done` after `]`, `failed` on junk."""

    def __init__(self, owner: CharParser) -> None:
        self.owner = owner
        self.done = False
        self.failed = False
        self.raw = ""
        self._state = "open"  # open, item, in_item, sep
        self._call: CallStreamer | None = None

    def char(self, ch: str, out: ParsedDelta) -> None:
        self.raw += ch
        if self._state == "in_item":
            self._item_char(ch, out)
        elif ch.isspace():
            return
        elif self._state == "open":
            self._state = "item" if ch == "[" else self._fail()
        elif self._state == "item" and ch == "{":
            self._call = CallStreamer(self.owner.num_calls)
            self._state = "in_item"
            self._item_char(ch, out)
        elif self._state == "sep" and ch == ",":
            self._state = "item"
        elif ch == "]" and self._state in ("item", "sep"):
            self.done = True
        else:
            self._fail()

    def _item_char(self, ch: str, out: ParsedDelta) -> None:
        assert self._call is not None
        self.owner.calls(self._call.feed(ch), out)
        if self._call.scanner.failed:
            self._fail()
        elif self._call.scanner.done:
            self.owner.calls(self._call.pull(final=True), out)
            self._state = "sep"

    def end(self, out: ParsedDelta) -> None:
        if self._state == "in_item" and self._call is not None:
            self.owner.calls(self._call.pull(final=True), out)

    @property
    def started_calls(self) -> bool:
        return self._call is not None and self._call.announced

    def _fail(self) -> str:
        self.failed = True
        return "failed"


class ObjectsBody:
    """`{call}` items separated by whitespace or any of `separators`."""

    def __init__(self, owner: CharParser, separators: str) -> None:
        self.owner = owner
        self.separators = separators
        self.failed = False
        self.raw = ""
        self._call: CallStreamer | None = None

    def char(self, ch: str, out: ParsedDelta) -> None:
        self.raw += ch
        if self._call is not None:
            self.owner.calls(self._call.feed(ch), out)
            if self._call.scanner.failed:
                self.failed = True
            elif self._call.scanner.done:
                self.owner.calls(self._call.pull(final=True), out)
                self._call = None
        elif ch == "{":
            self._call = CallStreamer(self.owner.num_calls)
            self.owner.calls(self._call.feed(ch), out)
        elif not (ch.isspace() or ch in self.separators):
            self.failed = True

    def end(self, out: ParsedDelta) -> None:
        if self._call is not None:
            self.owner.calls(self._call.pull(final=True), out)
