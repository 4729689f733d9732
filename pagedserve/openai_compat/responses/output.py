"""One generated choice -> Responses output items, and the stream events that build them.

The chat side's ChoiceParser splits the text into reasoning, content and tool-call deltas;
`OutputBuilder` turns them into items in the order the model wrote them (a reasoning item, a
message, function calls) and queues the events OpenAI streams for each: output_item.added, the
content part, the text or argument deltas, their done events, output_item.done. A whole
response is the same builder fed once, so streamed and whole responses always agree.
"""

from __future__ import annotations

from typing import Any

from pagedserve.openai_compat.chat.output import ChoiceDelta
from pagedserve.openai_compat.chat.tool_parsers import ToolCallDelta
from pagedserve.openai_compat.responses.input import (
    echoed_tool_choice,
    echoed_tools,
    new_item_id,
)
from pagedserve.openai_compat.responses.protocol import ResponsesRequest

Event = dict[str, Any]
"""A stream event without its sequence_number (the writer numbers them)."""


class OutputBuilder:
    def __init__(self, summary: bool) -> None:
        self.summary = summary
        """reasoning.summary was asked for: the reasoning item's summary repeats its text."""
        self.items: list[dict[str, Any]] = []
        """Closed items, in output order."""
        self.events: list[Event] = []
        """Events not yet taken by the writer (`take`)."""
        self._kind: str | None = None  # the open item: "reasoning", "message" or "function_call"
        self._id = ""
        self._text = ""
        self._call: dict[str, Any] = {}

    def take(self) -> list[Event]:
        events, self.events = self.events, []
        return events

    def feed(self, d: ChoiceDelta) -> None:
        if d.reasoning:
            self._open("reasoning")
            self._append(d.reasoning, "response.reasoning_text.delta")
        if d.content:
            self._open("message")
            self._append(d.content, "response.output_text.delta")
        for call in d.calls:
            self._feed_call(call)

    def finish(self, status: str) -> list[dict[str, Any]]:
        """Close the open item with `status` (completed or incomplete); an output without any
        item gets an empty message, so `output_text` is always there to read."""
        if not self.items and self._kind is None:
            self._open("message")
        self._close(status)
        return self.items

    @property
    def _index(self) -> int:
        return len(self.items)

    def _where(self) -> dict[str, Any]:
        return {"item_id": self._id, "output_index": self._index}

    def _open(self, kind: str) -> None:
        if self._kind == kind:
            return
        self._close("completed")
        self._kind, self._id, self._text = kind, new_item_id(kind), ""
        item = self._item("in_progress")
        self.events.append(
            {"type": "response.output_item.added", "output_index": self._index, "item": item}
        )
        part = _part(kind, "")
        if part is not None:
            self.events.append(
                {"type": "response.content_part.added", **self._where(), "content_index": 0,
                 "part": part}
            )  # fmt: skip

    def _append(self, text: str, event: str) -> None:
        self._text += text
        extra: dict[str, Any] = {"logprobs": []} if self._kind == "message" else {}
        self.events.append(
            {"type": event, **self._where(), "content_index": 0, "delta": text, **extra}
        )

    def _feed_call(self, call: ToolCallDelta) -> None:
        if call.name is not None:
            self._close("completed")
            self._call = {"call_id": call.id or new_item_id("call"), "name": call.name}
            self._open("function_call")
        elif self._kind != "function_call":
            return  # a fragment without its call's header: nothing to attach it to
        if call.arguments:
            self._text += call.arguments
            self.events.append(
                {"type": "response.function_call_arguments.delta", **self._where(),
                 "delta": call.arguments}
            )  # fmt: skip

    def _item(self, status: str) -> dict[str, Any]:
        if self._kind == "function_call":
            return {"id": self._id, "type": "function_call", "status": status, **self._call,
                    "arguments": self._text if status != "in_progress" else ""}  # fmt: skip
        done = status != "in_progress"
        part = _part(self._kind or "message", self._text)
        if self._kind == "reasoning":
            summary = [{"type": "summary_text", "text": self._text}] if self.summary else []
            return {"id": self._id, "type": "reasoning", "status": status,
                    "summary": summary if done else [], "content": [part] if done else []}  # fmt: skip
        return {"id": self._id, "type": "message", "role": "assistant", "status": status,
                "content": [part] if done else []}  # fmt: skip

    def _close(self, status: str) -> None:
        if self._kind is None:
            return
        where = self._where()
        if self._kind == "function_call":
            self.events.append(
                {"type": "response.function_call_arguments.done", **where,
                 "arguments": self._text}
            )  # fmt: skip
        else:
            self._close_text(where)
        item = self._item(status)
        self.events.append(
            {"type": "response.output_item.done", "output_index": self._index, "item": item}
        )
        self.items.append(item)
        self._kind = None

    def _close_text(self, where: dict[str, Any]) -> None:
        text, part = self._text, _part(self._kind or "message", self._text)
        if self._kind == "message":
            done: Event = {"type": "response.output_text.done", "text": text, "logprobs": []}
        else:
            done = {"type": "response.reasoning_text.done", "text": text}
        self.events.append({**done, **where, "content_index": 0})
        self.events.append(
            {"type": "response.content_part.done", **where, "content_index": 0, "part": part}
        )
        if self._kind == "reasoning" and self.summary:
            self.events.extend(_summary_events(where, text))


def _part(kind: str, text: str) -> dict[str, Any] | None:
    if kind == "message":
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    if kind == "reasoning":
        return {"type": "reasoning_text", "text": text}
    return None


def _summary_events(where: dict[str, Any], text: str) -> list[Event]:
    at = {**where, "summary_index": 0}
    empty, full = {"type": "summary_text", "text": ""}, {"type": "summary_text", "text": text}
    return [
        {"type": "response.reasoning_summary_part.added", **at, "part": empty},
        {"type": "response.reasoning_summary_text.delta", **at, "delta": text},
        {"type": "response.reasoning_summary_text.done", **at, "text": text},
        {"type": "response.reasoning_summary_part.done", **at, "part": full},
    ]


def base_response(
    req: ResponsesRequest, response_id: str, model: str, created_at: int
) -> dict[str, Any]:
    """The Response object's fields that echo the request (status, output, usage come later)."""
    text = req.text.model_dump(by_alias=True, exclude_none=True) if req.text else {}
    reasoning = req.reasoning
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": "in_progress",
        "background": bool(req.background),
        "error": None,
        "incomplete_details": None,
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "model": model,
        "output": [],
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "previous_response_id": req.previous_response_id,
        "reasoning": {
            "effort": reasoning.effort if reasoning else None,
            "summary": (reasoning.summary or reasoning.generate_summary) if reasoning else None,
        },
        "service_tier": "default",
        "store": req.store is not False,
        "temperature": 1.0 if req.temperature is None else req.temperature,
        "text": {"format": {"type": "text"}, **text},
        "tool_choice": echoed_tool_choice(req),
        "tools": echoed_tools(req),
        "top_p": 1.0 if req.top_p is None else req.top_p,
        "truncation": req.truncation or "disabled",
        "usage": None,
        "user": req.user,
        "metadata": req.metadata or {},
    }


def usage(num_input: int, num_output: int, num_cached: int, num_reasoning: int) -> dict[str, Any]:
    return {
        "input_tokens": num_input,
        "input_tokens_details": {"cached_tokens": num_cached, "cache_write_tokens": 0},
        "output_tokens": num_output,
        "output_tokens_details": {"reasoning_tokens": num_reasoning},
        "total_tokens": num_input + num_output,
    }
