"""One generated answer -> Anthropic content blocks, and the stream events that build them.

The chat side's ChoiceParser splits the text into reasoning, content and tool-call deltas;
`BlockBuilder` turns them into blocks in the order the model wrote them (thinking, text,
tool_use) and queues the events Anthropic streams for each: content_block_start, its deltas
(thinking_delta, text_delta, input_json_delta), content_block_stop. A whole message is the same
builder fed once, so streamed and whole answers agree.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

import orjson

from pagedserve.openai_compat.chat.output import ChoiceDelta
from pagedserve.openai_compat.chat.tool_parsers import ToolCallDelta

Event = dict[str, Any]


def new_id(prefix: str) -> str:
    """Anthropic's ids: msg_..., toolu_..."""
    return f"{prefix}_{secrets.token_hex(12)}"


def event_frame(event: Event) -> bytes:
    """An SSE frame with Anthropic's `event:` line (the event's type)."""
    name: str = event["type"]
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


class BlockBuilder:
    def __init__(self) -> None:
        self.blocks: list[dict[str, Any]] = []
        """Closed blocks, in output order."""
        self.events: list[Event] = []
        """Events not yet taken by the writer (`take`)."""
        self.num_tool_uses = 0
        self._kind: str | None = None  # the open block: "thinking", "text" or "tool_use"
        self._text = ""
        self._tool: dict[str, Any] = {}

    def take(self) -> list[Event]:
        events, self.events = self.events, []
        return events

    def feed(self, d: ChoiceDelta) -> None:
        if d.reasoning:
            self._open("thinking")
            self._append(d.reasoning, {"type": "thinking_delta", "thinking": d.reasoning})
        if d.content:
            self._open("text")
            self._append(d.content, {"type": "text_delta", "text": d.content})
        for call in d.calls:
            self._feed_call(call)

    def finish(self) -> list[dict[str, Any]]:
        """Close the open block; the blocks of the whole answer."""
        self._close()
        return self.blocks

    def _open(self, kind: str) -> None:
        if self._kind == kind:
            return
        self._close()
        self._kind, self._text = kind, ""
        self.events.append(
            {"type": "content_block_start", "index": len(self.blocks),
             "content_block": self._block(final=False)}
        )  # fmt: skip

    def _append(self, text: str, delta: dict[str, Any]) -> None:
        self._text += text
        self.events.append({"type": "content_block_delta", "index": len(self.blocks),
                            "delta": delta})  # fmt: skip

    def _feed_call(self, call: ToolCallDelta) -> None:
        if call.name is not None:
            self._close()
            self._tool = {"id": new_id("toolu"), "name": call.name}
            self.num_tool_uses += 1
            self._open("tool_use")
        elif self._kind != "tool_use":
            return  # a fragment without its call's header: nothing to attach it to
        if call.arguments:
            self._append(call.arguments, {"type": "input_json_delta",
                                          "partial_json": call.arguments})  # fmt: skip

    def _block(self, final: bool) -> dict[str, Any]:
        text = self._text if final else ""
        if self._kind == "thinking":
            return {"type": "thinking", "thinking": text, "signature": ""}
        if self._kind == "tool_use":
            return {"type": "tool_use", **self._tool, "input": _input(text) if final else {}}
        return {"type": "text", "text": text}

    def _close(self) -> None:
        if self._kind is None:
            return
        self.events.append({"type": "content_block_stop", "index": len(self.blocks)})
        self.blocks.append(self._block(final=True))
        self._kind = None


def _input(arguments: str) -> Any:
    """A call's arguments as the object Anthropic's `input` is (the parsers only emit JSON
    objects; an empty text is no arguments)."""
    if not arguments.strip():
        return {}
    try:
        return json.loads(arguments)
    except ValueError:
        return {"arguments": arguments}  # kept whole rather than dropped


def stop_reason(
    finish_reason: str | None, matched: int | str | None, num_tool_uses: int, stops: list[str]
) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) from the engine's finish: `matched` is the stop string or
    token id that ended it."""
    if finish_reason == "length":
        return "max_tokens", None
    if num_tool_uses:
        return "tool_use", None
    if isinstance(matched, str) and matched in stops:
        return "stop_sequence", matched
    return "end_turn", None


def usage(num_prompt: int, num_output: int, num_cached: int) -> dict[str, Any]:
    """Anthropic's usage: input_tokens counts the prompt tokens not read from the cache
    (cache_read_input_tokens), as Anthropic's does."""
    return {
        "input_tokens": num_prompt - num_cached,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": num_cached,
        "output_tokens": num_output,
    }


def message_object(
    message_id: str, model: str, content: list[dict[str, Any]], stop: tuple[str | None, str | None]
) -> dict[str, Any]:
    """The Message object (usage added by the caller); stop: (stop_reason, stop_sequence)."""
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop[0],
        "stop_sequence": stop[1],
    }
