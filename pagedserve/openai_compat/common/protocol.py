"""Request bodies of the OpenAI-compatible API (pydantic v2 models live only here).

Every model forbids unknown fields, so a typo or an unsupported feature is a 400 naming the field
instead of being silently ignored. OpenAI fields that pagedserve does not implement are declared
(so the OpenAPI schema shows them) and refused by `refuse_unsupported` unless they carry a value
that changes nothing (e.g. `response_format: {"type": "text"}`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.config import JsonDict

MAX_N = 128


# A token id: the schema states its bounds; validation leaves them to the vocabulary check,
# whose message names the model's range [0, vocab_size).
TokenId = Annotated[int, Field(json_schema_extra={"minimum": 0, "maximum": 2**31 - 1})]


class _Strict(BaseModel):
    # strict: JSON types as OpenAI takes them ("5" is not an int, 0.0 not a bool); an int is
    # still a valid float.
    model_config = ConfigDict(extra="forbid", strict=True)


def _no_nul(value: Any) -> Any:
    """A NUL character is never meaningful text; refuse it rather than feed it to the model."""
    texts = [value] if isinstance(value, str) else value if isinstance(value, list) else []
    if any(isinstance(t, str) and "\x00" in t for t in texts):
        raise ValueError("must not contain NUL characters (\\u0000)")
    return value


Text = Annotated[str, AfterValidator(_no_nul)]
"""A string field that refuses NUL characters (every endpoint's protocol uses it)."""


class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class TextPart(_Strict):
    type: Literal["text"]
    text: Annotated[str, AfterValidator(_no_nul)]


class ImageUrl(_Strict):
    url: str = Field(min_length=1)
    """data:<type>;base64,..., http(s)://... (fetched by the server) or file://... (under
    --allowed-local-media-path)."""
    detail: Literal["auto", "low", "high"] | None = None
    """Accepted; the model's image processor decides the resolution."""


class ImagePart(_Strict):
    type: Literal["image_url"]
    image_url: ImageUrl


# The cross-field rules below, stated in /openapi.json too, so that its bodies are the accepted ones.
_CONTENT_UNLESS_ASSISTANT: JsonDict = {
    "anyOf": [
        {"properties": {"role": {"const": "assistant"}}},
        {"required": ["content"], "properties": {"content": {"not": {"type": "null"}}}},
    ]
}
_NULL: JsonDict = {"type": "null"}  # an explicit null counts as absent
_PROMPT_XOR_MESSAGES: JsonDict = {
    "oneOf": [
        {"required": ["prompt"], "properties": {"prompt": {"type": "string"}, "messages": _NULL}},
        {"required": ["messages"], "properties": {"messages": {"type": "array"}, "prompt": _NULL}},
    ]
}


class FunctionCall(_Strict):
    name: str = Field(min_length=1)
    arguments: str
    """The arguments as a JSON text (OpenAI's shape)."""


class ToolCall(_Strict):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Strict):
    model_config = ConfigDict(json_schema_extra=_CONTENT_UNLESS_ASSISTANT)

    role: Literal["system", "developer", "user", "assistant", "tool"]
    # validate_default: a missing content must reach the check below, which needs the role.
    content: Annotated[str, AfterValidator(_no_nul)] | list[TextPart | ImagePart] | None = Field(
        default=None, validate_default=True
    )
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    """On assistant messages: the calls the model made."""
    tool_call_id: str | None = None
    """On tool messages: which call this is the result of."""
    reasoning_content: str | None = None
    """On assistant messages: earlier thinking (accepted, and left out of the prompt)."""

    @model_validator(mode="after")
    def _tool_fields(self) -> ChatMessage:
        # Plain ValueErrors: pydantic's location then names the message (messages[i]).
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages may carry tool_calls")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs tool_call_id")
        return self

    @field_validator("content")
    @classmethod
    def _content_required(cls, content: Any, info: ValidationInfo) -> Any:
        # OpenAI requires content except on assistant turns (which may carry only tool calls;
        # here an empty assistant turn renders as empty text).
        if content is None and info.data.get("role", "assistant") != "assistant":
            raise ValueError(f"content is required for a {info.data['role']} message")
        return content

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content if isinstance(part, TextPart))

    def image_urls(self) -> list[tuple[int, ImageUrl]]:
        """(index in content, its image_url) of each image part, in order."""
        if not isinstance(self.content, list):
            return []
        return [(i, p.image_url) for i, p in enumerate(self.content) if isinstance(p, ImagePart)]

    def for_template(self) -> dict[str, Any]:
        """What the chat template sees: role, content as text (as parts, {"type": "image"} in
        an image's place, when the message has images), and name when given (as transformers
        passes the message dicts)."""
        content: str | list[dict[str, str]] = self.text()
        if self.image_urls():
            assert isinstance(self.content, list)
            content = [{"type": "text", "text": p.text} if isinstance(p, TextPart)
                       else {"type": "image"} for p in self.content]  # fmt: skip
        message: dict[str, Any] = {"role": self.role, "content": content}
        if self.name is not None:
            message["name"] = self.name
        return message


class FieldError(ValueError):
    """A bad value found by a validator; `param` names the field for the error envelope."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param
        self.message = message


class FunctionDefinition(_Strict):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_.-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    """A JSON schema for the arguments (an object schema; absent: no arguments)."""
    strict: bool | None = None


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(_Strict):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)

    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise FieldError("response_format", "type json_schema needs json_schema")
        return self


class StructuredOutputsField(_Strict):
    """vLLM's `structured_outputs`: exactly one of these."""

    json_: dict[str, Any] | str | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None


def _absent(value: Any) -> bool:
    return value is None


# Unsupported OpenAI fields: the values accepted because they change nothing.
_HARMLESS: dict[str, Callable[[Any], bool]] = {
    "functions": lambda v: v is None or v == [],
    "function_call": lambda v: v in (None, "none", "auto"),
    "guided_decoding_backend": lambda v: v in (None, "xgrammar", "auto"),
    "guided_whitespace_pattern": _absent,
    "store": lambda v: v in (None, False),
    "metadata": lambda v: True,
    "service_tier": lambda v: v in (None, "auto", "default"),
    "prompt_cache_key": lambda v: True,
    "safety_identifier": lambda v: True,
    "audio": _absent,
    "modalities": lambda v: v is None or v == ["text"],
    "prediction": _absent,
    "reasoning_effort": _absent,
    "web_search_options": _absent,
    "verbosity": _absent,
    "best_of": lambda v: v in (None, 1),
}


class _SamplingFields(_Strict):
    """Fields shared by chat and completions requests."""

    model: str | None = None
    # OpenAI's ranges, so a value OpenAI refuses is a 400 naming the field here too.
    frequency_penalty: float | None = Field(default=0.0, ge=-2, le=2)
    presence_penalty: float | None = Field(default=0.0, ge=-2, le=2)
    logit_bias: dict[str, Annotated[float, Field(ge=-100, le=100)]] | None = None
    n: int | None = Field(default=1, ge=1, le=MAX_N)
    seed: int | None = None
    stop: Annotated[str | list[str] | None, AfterValidator(_no_nul)] = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    user: str | None = None
    # Extensions (vLLM names).
    top_k: int | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0, le=1)
    repetition_penalty: float | None = Field(default=None, gt=0)
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: list[TokenId] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    # Constrained decoding: OpenAI's response_format, and vLLM's names for the same engine.
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsField | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_decoding_backend: str | None = None
    guided_whitespace_pattern: str | None = None

    @model_validator(mode="after")
    def refuse_unsupported(self) -> _SamplingFields:
        for name in type(self).model_fields:
            accept = _HARMLESS.get(name)
            if accept is not None and not accept(getattr(self, name)):
                raise FieldError(name, "is not supported by this server")
        if self.stream_options is not None and not self.stream:
            raise FieldError("stream_options", "is only allowed when stream is true")
        return self

    def stop_list(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def continuous_usage(self) -> bool:
        """Usage on every chunk (vLLM's `continuous_usage_stats`)."""
        return bool(self.stream_options and self.stream_options.continuous_usage_stats)


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    add_generation_prompt: bool = True
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    """Extra variables for the chat template (e.g. enable_thinking), as vLLM takes them."""
    # Declared so the schema documents them; refused by refuse_unsupported.
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    audio: dict[str, Any] | None = None
    modalities: list[str] | None = None
    prediction: dict[str, Any] | None = None
    reasoning_effort: str | None = None
    web_search_options: dict[str, Any] | None = None
    verbosity: str | None = None

    @model_validator(mode="after")
    def check_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise FieldError("top_logprobs", "requires logprobs to be true")
        return self

    def output_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


Prompt = str | list[str] | list[TokenId] | list[list[TokenId]]


COMPLETION_DEFAULT_MAX_TOKENS = 16


class CompletionRequest(_SamplingFields):
    prompt: Annotated[Prompt, AfterValidator(_no_nul)]
    max_tokens: int | None = Field(default=COMPLETION_DEFAULT_MAX_TOKENS, ge=0)
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool | None = False
    suffix: Annotated[str | None, AfterValidator(_no_nul)] = None
    """Text after the completion: fill-in-the-middle on models with FIM tokens (else 400)."""
    best_of: int | None = None

    @model_validator(mode="after")
    def check_max_tokens(self) -> CompletionRequest:
        if self.max_tokens == 0 and not self.echo:
            raise FieldError("max_tokens", "may be 0 only with echo")
        return self

    def output_limit(self) -> int:
        """OpenAI's legacy completions: max_tokens "defaults to 16", null included (chat's null
        means up to the context)."""
        return COMPLETION_DEFAULT_MAX_TOKENS if self.max_tokens is None else self.max_tokens


class TokenizeRequest(_Strict):
    model_config = ConfigDict(json_schema_extra=_PROMPT_XOR_MESSAGES)

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True

    @model_validator(mode="after")
    def one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise FieldError("prompt", "give exactly one of prompt or messages")
        return self


class DetokenizeRequest(_Strict):
    model: str | None = None
    tokens: list[TokenId]


REQUEST_MODELS: dict[str, type[BaseModel]] = {
    "/v1/chat/completions": ChatCompletionRequest,
    "/v1/completions": CompletionRequest,
    "/tokenize": TokenizeRequest,
    "/detokenize": DetokenizeRequest,
}
"""The request body of each POST route (used by /openapi.json)."""
