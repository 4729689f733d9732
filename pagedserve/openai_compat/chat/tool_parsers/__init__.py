"""Tool-call parsers: the model's own call format -> OpenAI's `tool_calls` (whole or streamed).

Chosen by `--tool-call-parser` or from the chat template (`parser_for_template`)."""

from __future__ import annotations

from collections.abc import Callable

from pagedserve.openai_compat.chat.tool_parsers.base import (
    ParsedCall,
    ParsedDelta,
    ToolCallDelta,
    ToolParser,
    parse_all,
)
from pagedserve.openai_compat.chat.tool_parsers.formats import (
    HermesParser,
    Llama3JsonParser,
    MistralParser,
    NamedParser,
    RequiredParser,
)

PARSERS: dict[str, Callable[[], ToolParser]] = {
    "hermes": HermesParser,
    "llama3_json": Llama3JsonParser,
    "mistral": MistralParser,
}
"""`--tool-call-parser` names (vLLM's) -> parser."""

SPECIAL_TOKEN_PARSERS = frozenset({"llama3_json", "mistral"})
"""Parsers whose markers are special tokens: their outputs keep special tokens in the text."""


def parser_for_template(source: str | None) -> str | None:
    """The parser a chat template's own tool format needs; None when it has no tool format."""
    if not source or "tools" not in source:
        return None
    if "<tool_call>" in source:
        return "hermes"
    if "[TOOL_CALLS]" in source:
        return "mistral"
    if "<|python_tag|>" in source or "ipython" in source:
        return "llama3_json"
    return None


__all__ = [
    "PARSERS",
    "SPECIAL_TOKEN_PARSERS",
    "NamedParser",
    "ParsedCall",
    "ParsedDelta",
    "RequiredParser",
    "ToolCallDelta",
    "ToolParser",
    "parse_all",
    "parser_for_template",
]
