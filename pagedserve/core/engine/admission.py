"""Admission: what a request must satisfy before it enters the engine, as pure functions of
the request and the model's limits (the engine's methods of the same names call them)."""

from __future__ import annotations

from pagedserve.core.errors import ContextLengthError
from pagedserve.core.multimodal.inputs import MultiModalInputs
from pagedserve.core.pooling_params import PoolerConfig, PoolingParams
from pagedserve.core.sampling_params import SamplingParams


def resolve_max_tokens(max_model_len: int, num_prompt_tokens: int, params: SamplingParams) -> int:
    """params.max_tokens against the context; ContextLengthError when it cannot fit."""
    if num_prompt_tokens == 0:
        raise ContextLengthError("the prompt is empty: give at least one token", "prompt")
    room = max_model_len - num_prompt_tokens
    if params.max_tokens is None and room >= 1:
        return room
    wanted = params.max_tokens or 1
    if wanted > room:
        raise ContextLengthError(
            f"This model's maximum context length is {max_model_len} tokens. However, "
            f"you requested {num_prompt_tokens + wanted} tokens ({num_prompt_tokens} in the "
            f"prompt, {wanted} for the completion). Shorten the prompt or lower max_tokens."
        )
    return wanted


def check_pooling(
    pooler: PoolerConfig | None, max_model_len: int, num_prompt_tokens: int, params: PoolingParams
) -> None:
    """An embedding request's admission: ValueError (ContextLengthError for the length) when
    the model serves no embeddings or the input cannot run."""
    if pooler is None:
        raise ValueError("this model is not an embedding model (it serves task generate)")
    if num_prompt_tokens == 0:
        raise ContextLengthError("the input is empty: give at least one token", "input")
    if num_prompt_tokens > max_model_len:
        raise ContextLengthError(
            f"This model's maximum context length is {max_model_len} tokens. However, "
            f"the input has {num_prompt_tokens} tokens. Shorten it (or set "
            "truncate_prompt_tokens).",
            "input",
        )
    pooler.check_dimensions(params.dimensions)


def text_ids(prompt_token_ids: list[int], multimodal: MultiModalInputs) -> list[int]:
    """The prompt without its image tokens; ValueError for spans that do not fit the prompt."""
    spans = multimodal.spans()
    if any(s < 0 or e > len(prompt_token_ids) for s, e in spans):
        raise ValueError("an image's tokens lie outside the prompt")
    in_image = bytearray(len(prompt_token_ids))
    for s, e in spans:
        in_image[s:e] = b"\x01" * (e - s)
    return [t for t, inside in zip(prompt_token_ids, in_image, strict=True) if not inside]
