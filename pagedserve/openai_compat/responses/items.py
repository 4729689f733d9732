"""The input items of POST /v1/responses (OpenAI's Responses API) as pydantic models: messages
with their content parts, function calls and their outputs, reasoning items, and `Input` (a
string or a list of items). OpenAI's output items are valid input items, so a client can replay a
response's `output` as the next request's `input`. The request body itself is protocol.py's.
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

from pagedserve.openai_compat.common.protocol import FieldError, Text, _Strict

ItemStatus = Literal["in_progress", "completed", "incomplete"]


def _never(schema: JsonDict) -> None:
    """The published schema of a shape that is always refused: nothing matches it (so valid
    generated bodies never hold it; schema-breaking ones may)."""
    schema["not"] = {}


def _tag(default: str, message: str) -> Any:
    """A discriminator on `type` that reads dicts and models, with a default for dicts
    without one (OpenAI's "easy" message has no type). Tags are bracketed: the error
    envelope's `param` leaves them out of the field path."""

    def read(value: Any) -> str:
        if isinstance(value, dict):
            kind = value.get("type", default)
            return f"[{kind}]" if isinstance(kind, str) else "?"
        return f"[{getattr(value, 'type', default)}]"

    return Discriminator(read, custom_error_type="unsupported_kind", custom_error_message=message)


def _other(known: tuple[str, ...]) -> Any:
    """Like _tag, but every type outside `known` is tagged "other"."""

    def read(value: Any) -> str:
        if isinstance(value, str):
            return "[mode]"
        kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
        return f"[{kind}]" if kind in known else "[other]"

    return Discriminator(read)


class InputText(_Strict):
    type: Literal["input_text"]
    text: Text


class OutputText(_Strict):
    type: Literal["output_text"]
    text: Text
    annotations: list[dict[str, Any]] | None = None
    logprobs: list[dict[str, Any]] | None = None


class Refusal(_Strict):
    type: Literal["refusal"]
    refusal: Text


class InputImage(_Strict):
    """An image by URL (data:, http(s): or file:, as chat's image_url takes them); the model
    must take images (else the request is a 400)."""

    type: Literal["input_image"]
    image_url: str | None = Field(default=None, min_length=1)
    file_id: str | None = None
    """Declared so the error names it: this server keeps no files."""
    detail: Literal["auto", "low", "high"] | None = None

    @model_validator(mode="after")
    def _url_only(self) -> InputImage:
        if self.file_id is not None:
            raise FieldError("input", "input_image file_id is not supported: give image_url")
        if self.image_url is None:
            raise FieldError("input", "input_image needs image_url")
        return self


class MediaPart(BaseModel):
    """Files and audio: declared so the error names them; this server reads text and images."""

    model_config = ConfigDict(extra="allow", strict=True, json_schema_extra=_never)
    type: Literal["input_file", "input_audio"]

    @model_validator(mode="after")
    def _refuse(self) -> MediaPart:
        raise FieldError("input", f"{self.type} content is not supported: the model reads text")


def _json_type(value: Any) -> str:
    return "[text]" if isinstance(value, str) else "[items]"


# `str | list[...]` fields tagged by the value's JSON type, so errors come from the branch it
# picks (a plain union would report the string branch's complaint about a list).
_BY_JSON_TYPE = Discriminator(_json_type)


ContentPart = Annotated[
    Annotated[InputText, Tag("[input_text]")]
    | Annotated[OutputText, Tag("[output_text]")]
    | Annotated[Refusal, Tag("[refusal]")]
    | Annotated[InputImage, Tag("[input_image]")]
    | Annotated[MediaPart, Tag("[input_file]")]
    | Annotated[MediaPart, Tag("[input_audio]")],
    _tag("?", "content parts are input_text, input_image, output_text or refusal"),
]


Content = Annotated[
    Annotated[Text, Tag("[text]")] | Annotated[list[ContentPart], Tag("[items]")], _BY_JSON_TYPE
]


class MessageItem(_Strict):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: Content
    id: str | None = None
    status: ItemStatus | None = None
    phase: Literal["commentary", "final_answer"] | None = None


class _CallItemFields(_Strict):
    call_id: str = Field(min_length=1)
    id: str | None = None
    status: ItemStatus | None = None


class FunctionCallItem(_CallItemFields):
    type: Literal["function_call"]
    name: str = Field(min_length=1)
    arguments: Text


class FunctionCallOutputItem(_CallItemFields):
    type: Literal["function_call_output"]
    output: Content


class SummaryText(_Strict):
    type: Literal["summary_text"]
    text: Text


class ReasoningText(_Strict):
    type: Literal["reasoning_text"]
    text: Text


class ReasoningItem(_Strict):
    """Earlier thinking: accepted and left out of the prompt (as chat's reasoning_content)."""

    type: Literal["reasoning"]
    id: str | None = None
    summary: list[SummaryText] = Field(default_factory=list)
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None
    status: ItemStatus | None = None


InputItem = Annotated[
    Annotated[MessageItem, Tag("[message]")]
    | Annotated[FunctionCallItem, Tag("[function_call]")]
    | Annotated[FunctionCallOutputItem, Tag("[function_call_output]")]
    | Annotated[ReasoningItem, Tag("[reasoning]")],
    _tag(
        "message",
        "items are message, function_call, function_call_output or reasoning (no other kind "
        "is supported)",
    ),
]


Input = Annotated[
    Annotated[Text, Tag("[text]")] | Annotated[list[InputItem], Tag("[items]")], _BY_JSON_TYPE
]
