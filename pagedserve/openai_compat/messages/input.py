"""A Messages request -> the chat request the chat machinery serves.

`system` becomes a system message first; a user turn's text and image blocks a user message
(an image as an image_url part: a base64 source as a data: URL) and its tool_result blocks tool
messages (in the order they come); an assistant turn's text its content,
its tool_use blocks its tool_calls and its thinking blocks reasoning_content (left out of the
prompt, as chat does). Custom tools, tool_choice (auto / any / tool / none), stop_sequences and
thinking become chat's tools, tool_choice, stop and chat_template_kwargs, so the same
templates, tool parsers, grammars and reasoning parser serve both APIs.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from pagedserve.openai_compat.common import errors
from pagedserve.openai_compat.common.protocol import ChatCompletionRequest
from pagedserve.openai_compat.messages.protocol import (
    CountTokensRequest,
    ImageBlock,
    Message,
    MessagesRequest,
    TextBlock,
    ThinkingDisabled,
    ToolChoiceNone,
    ToolChoiceTool,
    ToolResultBlock,
    ToolUseBlock,
)


def chat_request(req: CountTokensRequest) -> ChatCompletionRequest:
    """The chat request of a Messages body (a count_tokens body: its prompt only)."""
    if req.messages[-1].role == "assistant":
        raise errors.invalid(
            "A last assistant message (prefill) is not supported yet: end with a user message.",
            "messages",
        )
    body: dict[str, Any] = {"messages": chat_messages(req.system_text(), req.messages)}
    body.update(_tools(req))
    if isinstance(req, MessagesRequest):
        body.update(
            max_tokens=req.max_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            stop=req.stop_sequences or None,
        )
    if req.thinking is not None:
        enable = not isinstance(req.thinking, ThinkingDisabled)
        body["chat_template_kwargs"] = {"enable_thinking": enable}
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:
        message = errors.from_validation_error(exc).message
        raise errors.invalid(
            f"The messages do not make a valid conversation: {message}", "messages"
        ) from None


def chat_messages(system: str, messages: list[Message]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    for message in messages:
        if message.role == "assistant":
            out.append(_assistant(message))
        else:
            out.extend(_user(message))
    return out


def image_blocks(messages: list[Message]) -> list[str]:
    """The param naming each image block, in order: chat's image parts come in the same order
    (chat_messages keeps it), so the n-th image part's error can name the n-th block."""
    return [f"messages[{i}].content[{j}]" for i, m in enumerate(messages)
            for j, b in enumerate(m.blocks()) if isinstance(b, ImageBlock)]  # fmt: skip


def _user(message: Message) -> list[dict[str, Any]]:
    """Consecutive text and image blocks make one user message; each tool_result a tool
    message."""
    out: list[dict[str, Any]] = []
    for block in message.blocks():
        if isinstance(block, ToolResultBlock):
            out.append({"role": "tool", "tool_call_id": block.tool_use_id,
                        "content": block.text()})  # fmt: skip
        elif isinstance(block, TextBlock | ImageBlock):
            part: dict[str, Any] = (
                {"type": "text", "text": block.text}
                if isinstance(block, TextBlock)
                else {"type": "image_url", "image_url": {"url": block.url()}}
            )
            if out and out[-1]["role"] == "user":
                out[-1]["content"].append(part)
            else:
                out.append({"role": "user", "content": [part]})
    return out


def _assistant(message: Message) -> dict[str, Any]:
    blocks = message.blocks()
    parts = [{"type": "text", "text": b.text} for b in blocks if isinstance(b, TextBlock)]
    thinking = "".join(getattr(b, "thinking", "") for b in blocks)
    calls = [
        {
            "id": b.id,
            "type": "function",
            "function": {"name": b.name, "arguments": json.dumps(b.input, ensure_ascii=False)},
        }
        for b in blocks
        if isinstance(b, ToolUseBlock)
    ]
    out: dict[str, Any] = {"role": "assistant", "content": parts or None}
    if calls:
        out["tool_calls"] = calls
    if thinking:
        out["reasoning_content"] = thinking
    return out


def _tools(req: CountTokensRequest) -> dict[str, Any]:
    """chat's tools, tool_choice and parallel_tool_calls."""
    tools = [
        {
            "type": "function",
            "function": {
                "name": t.name,
                "description": t.description,
                "parameters": t.input_schema,
            },
        }
        for t in req.tools or []
    ]
    choice = req.tool_choice
    out: dict[str, Any] = {"tools": tools or None}
    if choice is None:
        return out
    if isinstance(choice, ToolChoiceNone):
        return {**out, "tool_choice": "none"}
    if not tools:
        raise errors.invalid("tool_choice needs tools.", "tool_choice")
    if isinstance(choice, ToolChoiceTool):
        out["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    else:
        out["tool_choice"] = "required" if choice.type == "any" else "auto"
    if choice.disable_parallel_tool_use:
        out["parallel_tool_calls"] = False
    return out
