"""One chat choice's text -> OpenAI's message parts: reasoning, content, tool calls.

Reasoning is split off first (`<think>`), then the rest goes through the tool-call parser. The
same object serves whole responses (`message`) and streams (`delta_of`), so both agree.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pagedserve.openai_compat.chat.reasoning import ReasoningParser
from pagedserve.openai_compat.chat.tool_parsers import ParsedDelta, ToolCallDelta, ToolParser
from pagedserve.openai_compat.chat.tool_parsers.base import fold_calls


@dataclass
class ChoiceDelta:
    reasoning: str = ""
    content: str = ""
    calls: list[ToolCallDelta] = field(default_factory=list)


@dataclass
class OutputPlan:
    """How every choice of one request is read."""

    reasoning: bool = False
    prompt_text: str = ""
    """The rendered prompt (the reasoning parser checks whether it opened <think>)."""
    tool_parser: Callable[[], ToolParser] | None = None
    single_call: bool = False
    """parallel_tool_calls false: calls after the first are dropped."""

    def new_choice(self) -> ChoiceParser:
        reasoning = ReasoningParser(self.prompt_text) if self.reasoning else None
        tools = self.tool_parser() if self.tool_parser is not None else None
        return ChoiceParser(reasoning, tools, self.single_call)


class ChoiceParser:
    def __init__(
        self, reasoning: ReasoningParser | None, tools: ToolParser | None, single_call: bool
    ) -> None:
        self.reasoning = reasoning
        self.tools = tools
        self.num_calls = 0
        self._max_index = 0 if single_call else None

    def feed(self, text: str, final: bool) -> ChoiceDelta:
        out = ChoiceDelta()
        content = text
        if self.reasoning is not None:
            r = self.reasoning.feed(text)
            if final:
                end = self.reasoning.finish()
                r.reasoning, r.content = r.reasoning + end.reasoning, r.content + end.content
            out.reasoning, content = r.reasoning, r.content
        if self.tools is None:
            out.content = content
            return out
        parsed = self.tools.feed(content)
        if final:
            parsed.extend(self.tools.finish())
        return self._with_calls(out, parsed)

    def _with_calls(self, out: ChoiceDelta, parsed: ParsedDelta) -> ChoiceDelta:
        calls = parsed.calls
        if self._max_index is not None:
            calls = [c for c in calls if c.index <= self._max_index]
        out.content, out.calls = parsed.content, calls
        self.num_calls += sum(1 for c in calls if c.name is not None)
        return out

    def finish_reason(self, reason: str | None) -> str | None:
        return "tool_calls" if reason == "stop" and self.num_calls else reason

    def message(self, text: str) -> dict[str, Any]:
        """The whole output as OpenAI's assistant message."""
        d = self.feed(text, final=True)
        message: dict[str, Any] = {"role": "assistant", "content": d.content, "refusal": None}
        if self.reasoning is not None:
            message["reasoning_content"] = d.reasoning or None
        calls = fold_calls(d.calls)
        if calls:
            message["content"] = d.content or None
            message["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in calls
            ]
        return message

    def delta_of(self, text: str, final: bool) -> dict[str, Any]:
        """One streamed piece as OpenAI's chunk delta (empty when nothing is ready to send)."""
        d = self.feed(text, final)
        delta: dict[str, Any] = {}
        if d.reasoning:
            delta["reasoning_content"] = d.reasoning
        if d.content:
            delta["content"] = d.content
        if d.calls:
            delta["tool_calls"] = [_call_delta(c) for c in _merge_same_index(d.calls)]
        return delta


def _merge_same_index(calls: list[ToolCallDelta]) -> list[ToolCallDelta]:
    """One entry per call index in a chunk (its header, if any, carrying the fragments)."""
    merged: list[ToolCallDelta] = []
    for c in calls:
        if merged and merged[-1].index == c.index and c.name is None:
            last = merged[-1]
            merged[-1] = ToolCallDelta(last.index, last.arguments + c.arguments, last.id, last.name)
        else:
            merged.append(c)
    return merged


def _call_delta(c: ToolCallDelta) -> dict[str, Any]:
    if c.name is not None:
        return {
            "index": c.index,
            "id": c.id,
            "type": "function",
            "function": {"name": c.name, "arguments": c.arguments},
        }
    return {"index": c.index, "function": {"arguments": c.arguments}}
