"""The request bodies of POST /v1/messages and /v1/messages/count_tokens (Anthropic's Messages
API), as pydantic models.

The same rules as the OpenAI side: unknown fields are a 400 naming them; content this server
cannot read (documents, images from the Files API, server tools) is declared so the error names
it, and refused. Images (base64 or URL sources) go to models that take images, as chat's
image_url parts.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    model_validator,
)
from pydantic.config import JsonDict
from pydantic_core import PydanticCustomError

from pagedserve.openai_compat.common.protocol import FieldError, Text, _Strict

CacheControl = dict[str, Any] | None
"""Accepted on blocks, tools and system: this server's prefix cache needs no marks."""


def _never(schema: JsonDict) -> None:
    """The published schema of a shape that is always refused: nothing matches it."""
    schema["not"] = {}


def _kind(known: tuple[str, ...], message: str) -> Any:
    """A discriminator on `type`, every type outside `known` tagged "[other]". Tags are
    bracketed: the error envelope's field path leaves them out."""

    def read(value: Any) -> str:
        kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
        if not isinstance(kind, str):
            return "?"
        return f"[{kind}]" if kind in known else "[other]"

    return Discriminator(read, custom_error_type="unsupported_kind", custom_error_message=message)


def _by_json_type(value: Any) -> str:
    return "[text]" if isinstance(value, str) else "[items]"


class TextBlock(_Strict):
    type: Literal["text"]
    text: Text
    cache_control: CacheControl = None
    citations: list[dict[str, Any]] | None = None


class UnreadableBlock(BaseModel):
    """Documents and every other kind: named in the error, never silently dropped."""

    model_config = ConfigDict(extra="allow", strict=True, json_schema_extra=_never)
    type: str

    @model_validator(mode="after")
    def _refuse(self) -> UnreadableBlock:
        # A custom error keeps pydantic's location, so the message names the block. Image
        # blocks reach here only inside a tool_result: the top level reads them.
        if self.type == "image":
            raise PydanticCustomError(
                "unsupported",
                "image blocks inside tool_result content are not supported: send the image "
                "in the user message's content",
            )
        raise PydanticCustomError(
            "unsupported",
            "{kind} content blocks are not supported: this server reads text, image, "
            "tool_use, tool_result, thinking and redacted_thinking blocks",
            {"kind": self.type},
        )


class Base64ImageSource(_Strict):
    type: Literal["base64"]
    media_type: Literal["image/jpeg", "image/png", "image/gif", "image/webp"]
    data: str = Field(min_length=1)


class UrlImageSource(_Strict):
    type: Literal["url"]
    url: str = Field(min_length=1)


class UnreadableImageSource(BaseModel):
    """The Files API's `file` source and any other: named in the error."""

    model_config = ConfigDict(extra="allow", strict=True, json_schema_extra=_never)
    type: str

    @model_validator(mode="after")
    def _refuse(self) -> UnreadableImageSource:
        raise PydanticCustomError(
            "unsupported",
            "{kind} image sources are not supported: give a base64 or url source",
            {"kind": self.type},
        )


ImageSource = Annotated[
    Annotated[Base64ImageSource, Tag("[base64]")]
    | Annotated[UrlImageSource, Tag("[url]")]
    | Annotated[UnreadableImageSource, Tag("[other]")],
    _kind(("base64", "url"), "image sources need a string type"),
]


class ImageBlock(_Strict):
    type: Literal["image"]
    source: ImageSource
    cache_control: CacheControl = None

    def url(self) -> str:
        """The image as chat's image_url reads it: a data: URL, or the URL as given."""
        source = self.source
        if isinstance(source, Base64ImageSource):
            return f"data:{source.media_type};base64,{source.data}"
        assert isinstance(source, UrlImageSource), "the other sources are refused when parsed"
        return source.url


class ToolUseBlock(_Strict):
    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    input: dict[str, Any]
    cache_control: CacheControl = None


ResultPart = Annotated[
    Annotated[TextBlock, Tag("[text]")] | Annotated[UnreadableBlock, Tag("[other]")],
    _kind(("text",), "tool_result content blocks need a string type"),
]


class ToolResultBlock(_Strict):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: (
        Annotated[
            Annotated[Text, Tag("[text]")] | Annotated[list[ResultPart], Tag("[items]")],
            Discriminator(_by_json_type),
        ]
        | None
    ) = None
    is_error: bool | None = None
    cache_control: CacheControl = None

    def text(self) -> str:
        content = self.content or ""
        if not isinstance(content, str):
            content = "".join(p.text for p in content if isinstance(p, TextBlock))
        text = content
        return f"Error: {text}" if self.is_error else text


class ThinkingBlock(_Strict):
    """Earlier thinking: accepted and left out of the prompt (as chat's reasoning_content)."""

    type: Literal["thinking"]
    thinking: Text
    signature: str | None = None


class RedactedThinkingBlock(_Strict):
    type: Literal["redacted_thinking"]
    data: str


Block = Annotated[
    Annotated[TextBlock, Tag("[text]")]
    | Annotated[ImageBlock, Tag("[image]")]
    | Annotated[ToolUseBlock, Tag("[tool_use]")]
    | Annotated[ToolResultBlock, Tag("[tool_result]")]
    | Annotated[ThinkingBlock, Tag("[thinking]")]
    | Annotated[RedactedThinkingBlock, Tag("[redacted_thinking]")]
    | Annotated[UnreadableBlock, Tag("[other]")],
    _kind(
        ("text", "image", "tool_use", "tool_result", "thinking", "redacted_thinking"),
        "content blocks need a string type",
    ),
]
_ASSISTANT_ONLY = ("tool_use", "thinking", "redacted_thinking")
_USER_ONLY = ("tool_result", "image")


class Message(_Strict):
    role: Literal["user", "assistant"]
    content: Annotated[
        Annotated[Text, Tag("[text]")] | Annotated[list[Block], Tag("[items]")],
        Discriminator(_by_json_type),
    ]

    @model_validator(mode="after")
    def _blocks_fit_role(self) -> Message:
        # Custom errors: pydantic's location then names the message (messages[i]).
        if not self.content:
            raise PydanticCustomError("empty", "all messages must have non-empty content")
        for block in self.blocks():
            if self.role == "user" and block.type in _ASSISTANT_ONLY:
                raise PydanticCustomError(
                    "misplaced", "{kind} blocks belong in assistant messages", {"kind": block.type}
                )
            if self.role == "assistant" and block.type in _USER_ONLY:
                raise PydanticCustomError(
                    "misplaced", "{kind} blocks belong in user messages", {"kind": block.type}
                )
        return self

    def blocks(self) -> list[Any]:
        if isinstance(self.content, str):
            return [TextBlock(type="text", text=self.content)]
        return list(self.content)


class CustomTool(_Strict):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")
    input_schema: dict[str, Any]
    description: str | None = None
    type: Literal["custom"] | None = None
    cache_control: CacheControl = None
    strict: bool | None = None

    @model_validator(mode="before")
    @classmethod
    def _custom_only(cls, data: Any) -> Any:
        kind = data.get("type") if isinstance(data, dict) else None
        if kind not in (None, "custom"):
            raise FieldError("tools", f"server tools ({kind}) are not supported: give custom "
                             "tools with name and input_schema")  # fmt: skip
        return data


class _ChoiceFields(_Strict):
    disable_parallel_tool_use: bool | None = None


class ToolChoiceAuto(_ChoiceFields):
    type: Literal["auto"]


class ToolChoiceAny(_ChoiceFields):
    type: Literal["any"]


class ToolChoiceTool(_ChoiceFields):
    type: Literal["tool"]
    name: str = Field(min_length=1)


class ToolChoiceNone(_Strict):
    type: Literal["none"]


ToolChoice = Annotated[
    ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool | ToolChoiceNone, Field(discriminator="type")
]


class ThinkingEnabled(_Strict):
    type: Literal["enabled"]
    budget_tokens: int = Field(ge=1024)
    display: Literal["summarized", "omitted"] | None = None


class ThinkingAdaptive(_Strict):
    type: Literal["adaptive"]
    display: Literal["summarized", "omitted"] | None = None


class ThinkingDisabled(_Strict):
    type: Literal["disabled"]


Thinking = Annotated[
    ThinkingEnabled | ThinkingAdaptive | ThinkingDisabled, Field(discriminator="type")
]


class Metadata(_Strict):
    user_id: str | None = None


System = Annotated[
    Annotated[Text, Tag("[text]")] | Annotated[list[TextBlock], Tag("[items]")],
    Discriminator(_by_json_type),
]


class CountTokensRequest(_Strict):
    """What a prompt is made of: the body of /v1/messages/count_tokens."""

    model: str = Field(min_length=1)
    messages: list[Message] = Field(min_length=1)
    system: System | None = None
    tools: list[CustomTool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    cache_control: CacheControl = None

    def system_text(self) -> str:
        if self.system is None or isinstance(self.system, str):
            return self.system or ""
        return "".join(block.text for block in self.system)


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1)
    """Required, as Anthropic requires it."""
    stop_sequences: list[Text] | None = None
    stream: bool | None = False
    temperature: float | None = Field(default=None, ge=0, le=1)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=0)
    metadata: Metadata | None = None
    """Accepted (Anthropic's user_id); nothing here reads it."""
    service_tier: Literal["auto", "standard_only"] | None = None

    @model_validator(mode="after")
    def _budget_below_max_tokens(self) -> MessagesRequest:
        thinking = self.thinking
        if isinstance(thinking, ThinkingEnabled) and thinking.budget_tokens >= self.max_tokens:
            raise FieldError("thinking", "budget_tokens must be less than max_tokens")
        return self


MESSAGES_REQUEST_MODELS: dict[str, type[BaseModel]] = {
    "/v1/messages": MessagesRequest,
    "/v1/messages/count_tokens": CountTokensRequest,
}
"""The request body of each Messages route (used by /openapi.json)."""
