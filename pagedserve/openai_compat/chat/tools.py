"""The request side of tools: what the template sees, which grammar, which parser.

- tool_choice "none": tools stay out of the prompt, the output is text.
- "auto" (the default with tools): the model writes calls its own way; a parser picked by
  `--tool-call-parser` or from the template reads them.
- "required" / a named function: the output is constrained by a grammar built from the
  functions' parameter schemas (always a valid call), whatever the template.
- A template without a tool section (SmolLM2's) gets pagedserve's fallback: the tools described
  in a system message in the Hermes format (`<tool_call>{...}</tool_call>`, read back by the
  hermes parser), earlier calls and tool results written as text in that format.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pagedserve.core.sampling_params import StructuredOutputs
from pagedserve.core.tokenizers.chat_template import ChatTemplate
from pagedserve.openai_compat.chat.tool_parsers import (
    PARSERS,
    SPECIAL_TOKEN_PARSERS,
    NamedParser,
    RequiredParser,
    ToolParser,
    parser_for_template,
)
from pagedserve.openai_compat.common import errors
from pagedserve.openai_compat.common.protocol import ChatCompletionRequest, ChatMessage, Tool
from pagedserve.openai_compat.common.structured import json_schema_spec

EMPTY_OBJECT = {"type": "object", "properties": {}}

FALLBACK_PROMPT = """You can call these tools (functions):
<tools>
{tools}
</tools>
To call a tool, answer with one block per call, exactly:
<tool_call>
{{"name": "<function name>", "arguments": <the arguments as a JSON object>}}
</tool_call>"""


@dataclass
class ToolPlan:
    template_tools: list[dict[str, Any]] | None
    """What the template's `tools` variable gets (OpenAI's shape, as transformers passes it)."""
    fallback: bool
    """The template has no tool section: pagedserve writes tools, calls and results as text."""
    spec: StructuredOutputs | None
    """The grammar of required / named calls."""
    parser: Callable[[], ToolParser] | None
    keep_special_tokens: bool = False
    """The parser's markers are special tokens, so the text must keep them."""


def plan_tools(req: ChatCompletionRequest, template: ChatTemplate, configured: str) -> ToolPlan:
    """`configured`: ServerConfig.tool_call_parser."""
    tools = req.tools or []
    choice = req.tool_choice or ("auto" if tools else "none")
    fallback = "tools" not in template.variables
    if not tools:
        if choice not in ("none", "auto"):  # auto without tools changes nothing: accepted
            raise errors.invalid("tool_choice needs tools.", "tool_choice")
        return ToolPlan(None, fallback, None, None)
    names = [t.function.name for t in tools]
    if len(set(names)) != len(names):
        raise errors.invalid("tools: function names must be unique.", "tools")
    specs = {t.function.name: _parameters(t) for t in tools}
    shown = [t.model_dump(exclude_none=True, by_alias=True) for t in tools]
    if choice == "none":
        return ToolPlan(None, fallback, None, None)
    if choice == "required":
        spec = json_schema_spec(_required_schema(specs, req.parallel_tool_calls), "tools")
        return ToolPlan(shown, fallback, spec, RequiredParser)
    if choice != "auto":
        name = choice.function.name
        if name not in specs:
            raise errors.invalid(
                f"tool_choice names {name!r}, which is not in tools.", "tool_choice"
            )
        spec = json_schema_spec(specs[name], "tools")
        return ToolPlan(shown, fallback, spec, lambda: NamedParser(name))
    parser = configured if configured != "auto" else None
    parser = parser or (None if fallback else parser_for_template(template.source)) or "hermes"
    return ToolPlan(shown, fallback, None, PARSERS[parser], parser in SPECIAL_TOKEN_PARSERS)


def _parameters(tool: Tool) -> dict[str, Any]:
    params = tool.function.parameters
    if params is None:
        return EMPTY_OBJECT
    json_schema_spec(params, "tools")  # a bad schema is a 400 naming tools
    return params


def _required_schema(specs: dict[str, dict[str, Any]], parallel: bool | None) -> dict[str, Any]:
    """A JSON array of {"name", "parameters"} objects, one alternative per function."""
    alternatives = [
        {
            "type": "object",
            "properties": {"name": {"const": name}, "parameters": params},
            "required": ["name", "parameters"],
            "additionalProperties": False,
        }
        for name, params in specs.items()
    ]
    schema: dict[str, Any] = {"type": "array", "items": {"anyOf": alternatives}, "minItems": 1}
    if parallel is False:
        schema["maxItems"] = 1
    return schema


def template_messages(messages: list[ChatMessage], plan: ToolPlan) -> list[dict[str, Any]]:
    """The messages as the template gets them (tool calls' arguments as objects, as
    transformers' templates expect), or as plain text under the fallback."""
    out = [_fallback_message(m) if plan.fallback else _message(m) for m in messages]
    if plan.fallback and plan.template_tools:
        listing = "\n".join(
            json.dumps(t["function"], ensure_ascii=False) for t in plan.template_tools
        )
        prompt = FALLBACK_PROMPT.format(tools=listing)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": out[0]["content"] + "\n\n" + prompt}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out


def _message(m: ChatMessage) -> dict[str, Any]:
    msg = m.for_template()
    if m.tool_calls:
        msg["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {
                    "name": c.function.name,
                    "arguments": _arguments(c.function.arguments),
                },
            }
            for c in m.tool_calls
        ]
    if m.tool_call_id is not None:
        msg["tool_call_id"] = m.tool_call_id
    return msg


def _fallback_message(m: ChatMessage) -> dict[str, Any]:
    if m.role == "tool":
        return {"role": "user", "content": f"<tool_response>\n{m.text()}\n</tool_response>"}
    msg = m.for_template()
    for c in m.tool_calls or []:
        call = {"name": c.function.name, "arguments": _arguments(c.function.arguments)}
        block = f"<tool_call>\n{json.dumps(call, ensure_ascii=False)}\n</tool_call>"
        msg["content"] = f"{msg['content']}\n{block}" if msg["content"] else block
    return msg


def _arguments(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments
