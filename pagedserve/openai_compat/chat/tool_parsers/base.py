"""What every tool-call parser shares: the streamed events, the JSON call scanner, markers.

A parser is fed the model's text as it streams (any split, down to one character at a time) and
returns, per piece, the content to show and the tool-call deltas in OpenAI's streaming shape
(index, id and name first, then argument fragments). The whole-text result is the same events
folded (`parse_all`), so streamed and unstreamed answers agree by construction.
"""

from __future__ import annotations

import json
import secrets
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

ARGUMENT_KEYS = ("arguments", "parameters")
"""The key holding a call's arguments: Hermes and Mistral say "arguments", Llama 3 "parameters"."""


def new_call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


@dataclass
class ToolCallDelta:
    index: int
    arguments: str = ""
    id: str | None = None
    """Set (with name) on a call's first delta only."""
    name: str | None = None


@dataclass
class ParsedDelta:
    content: str = ""
    calls: list[ToolCallDelta] = field(default_factory=list)

    def extend(self, other: ParsedDelta) -> None:
        self.content += other.content
        self.calls.extend(other.calls)


@dataclass
class ParsedCall:
    id: str
    name: str
    arguments: str


class ToolParser(ABC):
    """Stateful: one instance per output choice."""

    @abstractmethod
    def feed(self, text: str) -> ParsedDelta: ...

    @abstractmethod
    def finish(self) -> ParsedDelta:
        """The end of the output: release what was held back."""


def parse_all(parser: ToolParser, text: str) -> tuple[str, list[ParsedCall]]:
    """(content, calls) of a whole output."""
    delta = parser.feed(text)
    delta.extend(parser.finish())
    return delta.content, fold_calls(delta.calls)


def fold_calls(deltas: list[ToolCallDelta]) -> list[ParsedCall]:
    calls: dict[int, ParsedCall] = {}
    for d in deltas:
        if d.index not in calls:
            calls[d.index] = ParsedCall(d.id or new_call_id(), d.name or "", "")
        calls[d.index].arguments += d.arguments
    return [calls[i] for i in sorted(calls)]


def held_prefix(text: str, markers: tuple[str, ...]) -> int:
    """Length of the longest end of `text` that could begin one of the markers."""
    best = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), best, -1):
            if text.endswith(marker[:size]):
                best = size
                break
    return best


class CallScanner:
    """Reads one JSON object `{"name": ..., "arguments": {...}}` one character at a time.

    Tracks only what a call needs: the name (once its string closes) and where the arguments
    value starts and (once closed) ends. `failed` when the text is not such an object.
    """

    def __init__(self, bare_arguments: bool = False) -> None:
        self.text = ""
        self.name: str | None = None
        self.args_start: int | None = None
        self.args_end: int | None = None
        self.done = False
        self.failed = False
        self._bare = bare_arguments  # the object itself is the arguments (no name/arguments keys)
        self._depth = 0
        self._in_string = False
        self._escape = False
        self._expect = "open"  # open, key, colon, value, scalar, comma
        self._key: str | None = None
        self._start = 0

    @property
    def args_is_object(self) -> bool:
        return self.args_start is not None and self.text[self.args_start] in "{["

    def feed_char(self, ch: str) -> None:
        self.text += ch
        i = len(self.text) - 1
        if self._in_string:
            self._string_char(ch, i)
        elif not ch.isspace() or self._expect == "scalar":
            self._structural(ch, i)

    def _string_char(self, ch: str, i: int) -> None:
        if self._escape:
            self._escape = False
        elif ch == "\\":
            self._escape = True
        elif ch == '"':
            self._in_string = False
            if self._depth == 1 and self._expect == "key":
                key = _loads(self.text[self._start : i + 1])  # a JSON string literal
                self._key = key if isinstance(key, str) else None
                self._expect = "colon"
            elif self._depth == 1:
                self._value_end(i + 1)

    def _structural(self, ch: str, i: int) -> None:
        expect = self._expect
        if expect == "open":
            if ch != "{":
                self.failed = True
                return
            self._depth = 1
            self._expect = "key"
            if self._bare:
                self.args_start = i
        elif self._depth > 1:
            self._nested(ch, i)
        elif expect == "key":
            self._on_key(ch, i)
        elif expect == "colon":
            self._expect = "value" if ch == ":" else self._fail()
        elif expect == "value":
            self._on_value(ch, i)
        elif expect == "scalar":
            if ch in ",}" or ch.isspace():
                self._value_end(i)
                self._expect = "comma"
                if not ch.isspace():
                    self._structural(ch, i)
        elif expect == "comma":
            if ch == ",":
                self._expect = "key"
            elif ch == "}":
                self._close(i)
            else:
                self._fail()

    def _on_key(self, ch: str, i: int) -> None:
        if ch == '"':
            self._in_string, self._start = True, i
        elif ch == "}":
            self._close(i)
        else:
            self._fail()

    def _on_value(self, ch: str, i: int) -> None:
        self._start = i
        if not self._bare and self._key in ARGUMENT_KEYS and self.args_start is None:
            self.args_start = i
        if ch == '"':
            self._in_string = True
        elif ch in "{[":
            self._depth += 1
        else:
            self._expect = "scalar"

    def _nested(self, ch: str, i: int) -> None:
        if ch == '"':
            self._in_string = True
        elif ch in "{[":
            self._depth += 1
        elif ch in "}]":
            self._depth -= 1
            if self._depth == 1:
                self._value_end(i + 1)

    def _value_end(self, end: int) -> None:
        self._expect = "comma"
        if self._bare:
            return
        if self._key == "name" and self.name is None:
            value = _loads(self.text[self._start : end])
            self.name = value if isinstance(value, str) else None
        elif self._key in ARGUMENT_KEYS and self.args_start == self._start:
            self.args_end = end

    def _close(self, i: int) -> None:
        self._depth = 0
        self.done = True
        if self._bare:
            self.args_end = i + 1

    def _fail(self) -> str:
        self.failed = True
        return "failed"


def _loads(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return None


class CallStreamer:
    """A CallScanner plus what was already sent: turns its progress into ToolCallDeltas.

    Object arguments stream as their text grows; string-encoded arguments (some models write
    "arguments": "{...}") are sent decoded once complete. The name comes first: arguments
    written before it are held until it is known."""

    def __init__(self, index: int, name: str | None = None) -> None:
        self.index = index
        self.scanner = CallScanner(bare_arguments=name is not None)
        self._fixed_name = name
        self._announced = False
        self._sent = 0  # characters of the arguments text already sent

    @property
    def announced(self) -> bool:
        return self._announced

    def feed(self, ch: str) -> list[ToolCallDelta]:
        self.scanner.feed_char(ch)
        return self.pull()

    def pull(self, final: bool = False) -> list[ToolCallDelta]:
        s = self.scanner
        name = self._fixed_name or s.name
        out: list[ToolCallDelta] = []
        if name is None or s.failed:
            return out
        if not self._announced:
            self._announced = True
            out.append(ToolCallDelta(self.index, "", new_call_id(), name))
        fragment = self._arguments(final)
        if fragment:
            out.append(ToolCallDelta(self.index, fragment))
        return out

    def _arguments(self, final: bool) -> str:
        s = self.scanner
        if s.args_start is None:
            done = s.done or final
            if done and self._sent == 0:
                self._sent = 2
                return "{}"
            return ""
        end = s.args_end if s.args_end is not None else len(s.text)
        if not s.args_is_object:
            if s.args_end is None or self._sent:
                return ""
            value = _loads(s.text[s.args_start : s.args_end])
            text = value if isinstance(value, str) else json.dumps(value)
            self._sent = len(text)
            return text
        fragment = s.text[s.args_start + self._sent : end]
        self._sent += len(fragment)
        return fragment
