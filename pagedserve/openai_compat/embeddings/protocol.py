"""The body of POST /v1/embeddings, as OpenAI defines it (plus vLLM's truncate_prompt_tokens
and add_special_tokens).

`input` is a text, a list of texts, one list of token ids or a list of them; every list holds at
least one item and at most MAX_INPUTS inputs, every text at least one character. The limits are
stated in the schema, so /openapi.json publishes exactly the bodies accepted here.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    Field,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)

from pagedserve.openai_compat.common.protocol import FieldError, TokenId, _no_nul, _Strict

MAX_INPUTS = 2048
"""OpenAI's limit on the inputs of one request."""

Text = Annotated[str, Field(min_length=1)]
TokenIds = Annotated[list[TokenId], Field(min_length=1)]
EmbeddingInput = (
    Text
    | Annotated[list[Text], Field(min_length=1, max_length=MAX_INPUTS)]
    | TokenIds
    | Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_INPUTS)]
)


class EmbeddingRequest(_Strict):
    input: Annotated[EmbeddingInput, AfterValidator(_no_nul)]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    """base64: each vector's little-endian float32 bytes, base64-encoded (what the OpenAI SDK
    asks for by default, and decodes)."""
    dimensions: int | None = Field(default=None, ge=1)
    """Matryoshka truncation (then renormalization), where the model supports it."""
    user: str | None = None
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)
    """vLLM's: keep only the last k tokens of each input (-1: the model's context length);
    without it an input longer than the context is a 400."""
    add_special_tokens: bool = True
    """Tokenize texts with the model's special tokens (as sentence-transformers does)."""

    @field_validator("input", mode="wrap")
    @classmethod
    def explain_input(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        """One message about `input` as a whole (pydantic's would name a union member)."""
        try:
            return handler(value)
        except ValidationError as exc:
            problem = _input_problem(value) or exc.errors(include_url=False)[0]["msg"]
            raise FieldError("input", problem) from None

    @model_validator(mode="after")
    def check_truncation(self) -> EmbeddingRequest:
        if self.truncate_prompt_tokens == 0:
            raise FieldError("truncate_prompt_tokens", "must be -1 or at least 1")
        return self

    def inputs(self) -> list[str] | list[list[int]]:
        """Every input as a list: texts, or token id lists."""
        value = self.input
        if isinstance(value, str):
            return [value]
        if isinstance(value[0], int):
            return [value]  # one list of token ids
        return value


_SHAPES = "a string, a list of strings, a list of token ids or a list of lists of token ids"


def _input_problem(value: Any) -> str | None:
    """What is wrong with an `input` that failed validation, when it is a shape problem."""
    if isinstance(value, str):
        return "must not be an empty string" if not value else None
    if not isinstance(value, list):
        return f"must be {_SHAPES}"
    if not value:
        return "must hold at least one input"
    if len(value) > MAX_INPUTS and not all(type(item) is int for item in value):
        return f"holds {len(value)} inputs; at most {MAX_INPUTS} are allowed"
    empty = next((i for i, item in enumerate(value) if item in ("", [])), None)
    if empty is not None:
        return f"input {empty} is empty"
    return None if all(isinstance(item, str) for item in value) else f"must be {_SHAPES}"
