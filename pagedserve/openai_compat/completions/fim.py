"""Fill-in-the-middle prompts: `suffix` on /v1/completions, and /infill's (which imports this).

The markers are the tokenizer's `FimTokens` placed as ids around the plain-text encodings of
prefix and suffix (`Tokenizer.encode_plain`: text that spells a marker stays text), with the
model's BOS first where its tokenizer adds one. Generation stops at the model's EOS or one of
`FimTokens.end_ids`, through the engine's stop ids.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from pagedserve.core.sampling_params import SamplingParams
from pagedserve.core.tokenizers.load import FimTokens, Tokenizer
from pagedserve.openai_compat.common import errors


def require_fim(tokenizer: Tokenizer, model_name: str, param: str | None) -> FimTokens:
    """The model's FIM tokens, or a 400 naming `param` when it has none."""
    if tokenizer.fim is None:
        raise errors.invalid(
            f"The model `{model_name}` has no fill-in-the-middle tokens (such as <|fim_prefix|>, "
            "<fim_prefix> or <PRE>), so it cannot fill in text before a suffix.",
            param=param,
        )
    return tokenizer.fim


def fim_prompt(
    tokenizer: Tokenizer,
    fim: FimTokens,
    prefix_ids: Sequence[int],
    suffix_ids: Sequence[int],
    context_ids: Sequence[int] = (),
) -> list[int]:
    """`[bos] context <pre> prefix <suf> suffix <mid>` as token ids."""
    bos = tokenizer.bos_token_id if tokenizer.add_bos_token else None
    return fim.psm_prompt(prefix_ids, suffix_ids, bos_id=bos, context_ids=context_ids)


def fim_params(params: SamplingParams, fim: FimTokens) -> SamplingParams:
    """`params` that also stop at the model's FIM end tokens (unless ignore_eos)."""
    if params.ignore_eos:
        return params
    extra = sorted(fim.end_ids - set(params.stop_token_ids))
    return dataclasses.replace(params, stop_token_ids=(*params.stop_token_ids, *extra))
