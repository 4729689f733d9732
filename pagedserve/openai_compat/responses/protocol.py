"""The request body of POST /v1/responses (OpenAI's Responses API), as pydantic models.

The same rules as protocol.py: unknown fields are a 400 naming them, and OpenAI fields that
pagedserve does not implement are declared and refused unless their value changes nothing.
Input items (messages, function calls and outputs, reasoning) are items.py's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    Tag,
    model_validator,
)
from pydantic.config import JsonDict

from pagedserve.openai_compat.common.protocol import FieldError, Text, _Strict
from pagedserve.openai_compat.responses.items import Input, _never, _other

ItemStatus = Literal["in_progress", "completed", "incomplete"]


class FunctionTool(_Strict):
    type: Literal["function"]
    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_.-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class BuiltinTool(BaseModel):
    """OpenAI's hosted tools (web_search, file_search, computer_use_preview, code_interpreter,
    image_generation, mcp, ...): refused by name, never silently ignored."""

    model_config = ConfigDict(extra="allow", strict=True, json_schema_extra=_never)
    type: str

    @model_validator(mode="after")
    def _refuse(self) -> BuiltinTool:
        raise FieldError(
            "tools",
            f"the built-in tool {self.type!r} is not supported by this server "
            "(only function tools are)",
        )


ResponsesTool = Annotated[
    Annotated[FunctionTool, Tag("[function]")] | Annotated[BuiltinTool, Tag("[other]")],
    _other(("function",)),
]


class ToolChoiceFunction(_Strict):
    type: Literal["function"]
    name: str = Field(min_length=1)


class ToolChoiceAllowed(_Strict):
    """Restrict the tools to a subset: `mode` auto or required over those named."""

    type: Literal["allowed_tools"]
    mode: Literal["auto", "required"]
    tools: list[ToolChoiceFunction] = Field(min_length=1)


class ToolChoiceBuiltin(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, json_schema_extra=_never)
    type: str

    @model_validator(mode="after")
    def _refuse(self) -> ToolChoiceBuiltin:
        raise FieldError(
            "tool_choice", f"tool_choice {self.type!r} is not supported (only function tools are)"
        )


ToolChoice = Annotated[
    Annotated[Literal["none", "auto", "required"], Tag("[mode]")]
    | Annotated[ToolChoiceFunction, Tag("[function]")]
    | Annotated[ToolChoiceAllowed, Tag("[allowed_tools]")]
    | Annotated[ToolChoiceBuiltin, Tag("[other]")],
    _other(("function", "allowed_tools", "mode")),
]


class TextFormatText(_Strict):
    type: Literal["text"]


class TextFormatJsonObject(_Strict):
    type: Literal["json_object"]


class TextFormatJsonSchema(_Strict):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)

    type: Literal["json_schema"]
    name: str = Field(min_length=1, max_length=64)
    json_schema: dict[str, Any] = Field(alias="schema")
    description: str | None = None
    strict: bool | None = None


TextFormat = Annotated[
    TextFormatText | TextFormatJsonObject | TextFormatJsonSchema, Field(discriminator="type")
]


class TextConfig(_Strict):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None
    """A style hint: accepted, and changes nothing here."""


class ReasoningConfig(_Strict):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    """"none" turns thinking off in templates that read `enable_thinking`; other levels change
    nothing."""
    summary: Literal["auto", "concise", "detailed"] | None = None
    """Any value: the reasoning item's summary repeats its whole text."""
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


class StreamOptions(_Strict):
    include_obfuscation: bool | None = None


Includable = Literal[
    "message.output_text.logprobs",
    "reasoning.encrypted_content",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "code_interpreter_call.outputs",
]

_RESPONSES_HARMLESS: dict[str, Callable[[Any], bool]] = {
    "metadata": lambda v: True,
    "prompt_cache_key": lambda v: True,
    "safety_identifier": lambda v: True,
    "service_tier": lambda v: v in (None, "auto", "default"),
    "prompt_cache_retention": lambda v: True,
    "prompt_cache_options": lambda v: True,
    "stream_options": lambda v: True,
    "top_logprobs": lambda v: v is None or (v == 0 and type(v) is int),
    "prompt": lambda v: v is None,
    "conversation": lambda v: v is None,
    "context_management": lambda v: v is None,
    "background_options": lambda v: v is None,
    "moderation": lambda v: v is None,
    "image": lambda v: v is None,
    "access_programs": lambda v: v is None,
    "max_tool_calls": lambda v: v is None,
    # Asked for data this server never produces (logprobs, encrypted reasoning, hosted tools'
    # results): there is nothing to include.
    "include": lambda v: True,
}


def _metadata(value: dict[str, str] | None) -> dict[str, str] | None:
    if value is None:
        return value
    if len(value) > 16:
        raise ValueError("at most 16 pairs")
    if any(len(k) > 64 or len(v) > 512 for k, v in value.items()):
        raise ValueError("keys are at most 64 characters, values at most 512")
    return value


def _accepts(*values: Any) -> Any:
    """A field whose published schema is just the values accepted (default None)."""

    def schema(field: JsonDict) -> None:
        field.clear()
        field.update({"enum": list(values), "default": None})

    return Field(default=None, json_schema_extra=schema)


_INPUT_OR_PREVIOUS: JsonDict = {
    "anyOf": [
        {"required": ["input"], "properties": {"input": {"not": {"type": "null"}}}},
        {"required": ["previous_response_id"],
         "properties": {"previous_response_id": {"type": "string"}}},
    ]
}  # fmt: skip


class ResponsesRequest(_Strict):
    model_config = ConfigDict(json_schema_extra=_INPUT_OR_PREVIOUS)

    model: str | None = None
    input: Input | None = None
    instructions: Text | None = None
    """A system message before the input; not carried over by previous_response_id."""
    previous_response_id: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    tools: list[ResponsesTool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    stream: bool | None = False
    store: bool | None = True
    background: bool | None = False
    metadata: Annotated[dict[str, str] | None, AfterValidator(_metadata)] = None
    user: str | None = None
    truncation: Literal["auto", "disabled"] | None = None
    """"auto" is accepted; an input that does not fit is a 400 either way."""
    include: list[Includable] | None = None
    # Declared so the schema documents them; refused by refuse_unsupported unless harmless (the
    # published schema shows only the accepted values).
    service_tier: str | None = _accepts(None, "auto", "default")
    prompt_cache_key: str | None = None
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    prompt_cache_options: dict[str, Any] | None = None
    safety_identifier: str | None = None
    stream_options: StreamOptions | None = None
    top_logprobs: int | None = _accepts(None, 0)
    prompt: dict[str, Any] | None = _accepts(None)
    conversation: str | dict[str, Any] | None = _accepts(None)
    context_management: list[dict[str, Any]] | None = _accepts(None)
    background_options: dict[str, Any] | None = _accepts(None)
    moderation: dict[str, Any] | None = _accepts(None)
    image: dict[str, Any] | None = _accepts(None)
    access_programs: dict[str, Any] | None = _accepts(None)
    max_tool_calls: int | None = _accepts(None)

    @model_validator(mode="after")
    def refuse_unsupported(self) -> ResponsesRequest:
        for name, accept in _RESPONSES_HARMLESS.items():
            if not accept(getattr(self, name)):
                raise FieldError(name, "is not supported by this server")
        if self.background and self.store is False:
            raise FieldError("background", "background responses need store (not false)")
        if self.background and self.stream:
            raise FieldError("background", "streamed background responses are not supported")
        if self.input is None and self.previous_response_id is None:
            raise FieldError("input", "is required (unless previous_response_id is given)")
        return self

    def input_items(self) -> list[dict[str, Any]]:
        """The input as item dicts (a string is one user message)."""
        if self.input is None:
            return []
        if isinstance(self.input, str):
            return [{"type": "message", "role": "user", "content": self.input}]
        return [item.model_dump(exclude_none=True, by_alias=True) for item in self.input]


RESPONSES_REQUEST_MODELS: dict[str, type[BaseModel]] = {"/v1/responses": ResponsesRequest}
"""The POST bodies of the Responses routes (used by /openapi.json)."""
