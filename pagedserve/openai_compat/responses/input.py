"""A Responses request -> the chat request the chat machinery serves.

Items become chat messages: `instructions` a system message first, developer messages system
ones, function_call items the assistant's tool_calls (joined to the assistant message before
them), function_call_output items tool messages, reasoning items nothing (as chat leaves
reasoning_content out of the prompt). Function tools, tool_choice and text.format become chat's
tools, tool_choice and response_format, so the same templates, tool parsers and grammars serve
both APIs.
"""

from __future__ import annotations

import secrets
from typing import Any

from pydantic import ValidationError

from pagedserve.openai_compat.common import errors
from pagedserve.openai_compat.common.protocol import ChatCompletionRequest
from pagedserve.openai_compat.responses.protocol import (
    FunctionTool,
    ResponsesRequest,
    ToolChoiceAllowed,
    ToolChoiceFunction,
)

ID_PREFIXES = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fco",
    "reasoning": "rs",
}


def new_item_id(kind: str) -> str:
    return f"{ID_PREFIXES.get(kind, 'item')}_{secrets.token_hex(16)}"


def chat_request(req: ResponsesRequest, items: list[dict[str, Any]]) -> ChatCompletionRequest:
    """`items`: the conversation so far (previous responses' items, then this input)."""
    messages = chat_messages(req.instructions, items)
    if not any(m["role"] != "system" for m in messages):
        raise errors.invalid("The input has no message to answer.", "input")
    body: dict[str, Any] = {
        "messages": messages,
        "max_completion_tokens": req.max_output_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "parallel_tool_calls": req.parallel_tool_calls,
        "user": req.user,
    }
    tools, choice = _tools(req)
    if tools:
        body["tools"] = tools
    if choice is not None:
        body["tool_choice"] = choice
    fmt = req.text.format if req.text is not None else None
    if fmt is not None:
        body["response_format"] = _response_format(fmt.model_dump(by_alias=True))
    if req.reasoning is not None and req.reasoning.effort == "none":
        body["chat_template_kwargs"] = {"enable_thinking": False}
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:
        message = errors.from_validation_error(exc).message
        raise errors.invalid(
            f"The input does not make a valid conversation: {message}", "input"
        ) from None


def chat_messages(instructions: str | None, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if instructions:
        out.append({"role": "system", "content": instructions})
    for item in items:
        kind = item.get("type", "message")
        if kind == "message":
            role = "system" if item["role"] == "developer" else item["role"]
            out.append({"role": role, "content": message_content(item["content"])})
        elif kind == "function_call":
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]},
            }
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            content = item_text(item["output"])
            out.append({"role": "tool", "tool_call_id": item["call_id"], "content": content})
    return out


def message_content(content: str | list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """A message item's content as chat's: its text, or chat's text and image_url parts when
    it holds input_image parts."""
    if isinstance(content, str) or all(p.get("type") != "input_image" for p in content):
        return item_text(content)
    parts: list[dict[str, Any]] = []
    for part in content:
        if part.get("type") == "input_image":
            image = {k: part[k] for k in ("detail",) if part.get(k) is not None}
            parts.append({"type": "image_url", "image_url": {"url": part["image_url"], **image}})
        else:
            parts.append({"type": "text", "text": part.get("text", part.get("refusal", ""))})
    return parts


def item_text(content: str | list[dict[str, Any]]) -> str:
    if isinstance(content, str):
        return content
    return "".join(part.get("text", part.get("refusal", "")) for part in content)


def with_ids(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Input items as stored and listed: each with an id, a message's text as content parts."""
    out = []
    for item in items:
        item = {"type": "message", **item}
        item.setdefault("id", new_item_id(item["type"]))
        if item["type"] == "message" and isinstance(item["content"], str):
            part = "output_text" if item["role"] == "assistant" else "input_text"
            extra: dict[str, Any] = {"annotations": []} if part == "output_text" else {}
            item["content"] = [{"type": part, "text": item["content"], **extra}]
        out.append(item)
    return out


def _tools(req: ResponsesRequest) -> tuple[list[dict[str, Any]], Any]:
    tools = [t for t in req.tools or [] if isinstance(t, FunctionTool)]
    choice = req.tool_choice
    if isinstance(choice, ToolChoiceAllowed):
        allowed = {t.name for t in choice.tools}
        unknown = allowed - {t.name for t in tools}
        if unknown:
            raise errors.invalid(
                f"tool_choice allows {sorted(unknown)}, which are not in tools.", "tool_choice"
            )
        tools = [t for t in tools if t.name in allowed]
        choice = choice.mode
    if isinstance(choice, ToolChoiceFunction):
        return [_chat_tool(t) for t in tools], {
            "type": "function",
            "function": {"name": choice.name},
        }
    return [_chat_tool(t) for t in tools], choice


def _chat_tool(tool: FunctionTool) -> dict[str, Any]:
    function = tool.model_dump(exclude_none=True, exclude={"type"})
    return {"type": "function", "function": function}


def _response_format(fmt: dict[str, Any]) -> dict[str, Any]:
    if fmt["type"] != "json_schema":
        return {"type": fmt["type"]}
    schema = {k: v for k, v in fmt.items() if k != "type" and v is not None}
    return {"type": "json_schema", "json_schema": schema}


def echoed_tools(req: ResponsesRequest) -> list[dict[str, Any]]:
    """The request's tools as the Response object shows them."""
    return [
        {
            "type": "function",
            "name": t.name,
            "description": t.description,
            "parameters": t.parameters,
            "strict": t.strict,
        }
        for t in req.tools or []
        if isinstance(t, FunctionTool)
    ]


def echoed_tool_choice(req: ResponsesRequest) -> Any:
    choice = req.tool_choice
    if choice is None:
        return "auto"  # OpenAI's default, tools or not
    return choice if isinstance(choice, str) else choice.model_dump()
