"""Logprobs of chosen tokens: their value, their rank and the top-k alternatives."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pagedserve.core.outputs import TokenLogprob

PROMPT_CHUNK_ROWS = 256
"""Prompt positions per log_softmax, to bound the temporary [rows, vocab] copies."""


def token_logprobs(
    logprobs: torch.Tensor, token_ids: torch.Tensor, ks: Sequence[int]
) -> list[TokenLogprob]:
    """For each row of log-probabilities [n, vocab]: token_ids[row]'s logprob, its rank
    (1 + the number of strictly more likely tokens) and the ks[row] most likely tokens.
    logprobs is overwritten: the rank count runs in it, last, instead of in a copy."""
    chosen = logprobs.gather(1, token_ids[:, None])
    max_k = max(ks, default=0)
    top_ids: list[list[int]] = [[] for _ in ks]
    top_values: list[list[float]] = [[] for _ in ks]
    if max_k > 0:
        values, ids = logprobs.topk(max_k, dim=-1)
        top_ids, top_values = ids.tolist(), values.tolist()
    ranks = _count_greater_(logprobs, chosen) + 1
    return [
        TokenLogprob(
            token_id=token,
            logprob=value,
            rank=rank,
            top=list(zip(top_ids[i][:k], top_values[i][:k], strict=True)),
        )
        for i, (token, value, rank, k) in enumerate(
            zip(token_ids.tolist(), chosen[:, 0].tolist(), ranks.tolist(), ks, strict=True)
        )
    ]


def prompt_logprobs(
    logits: torch.Tensor, next_token_ids: torch.Tensor, k: int
) -> list[TokenLogprob]:
    """Logprob of each actual next prompt token under logits [t, vocab] (+ rank, + top k).

    Row i scores next_token_ids[i]; the caller shifts the prompt by one (token 0 has none).
    """
    if logits.shape[0] != next_token_ids.shape[0]:
        raise ValueError(
            f"next_token_ids: {next_token_ids.shape[0]} ids for {logits.shape[0]} logits rows"
        )
    next_token_ids = next_token_ids.to(device=logits.device, dtype=torch.long)
    out: list[TokenLogprob] = []
    for start in range(0, logits.shape[0], PROMPT_CHUNK_ROWS):
        rows = slice(start, start + PROMPT_CHUNK_ROWS)
        logprobs = torch.log_softmax(logits[rows].float(), dim=-1)
        ids = next_token_ids[rows]
        out.extend(token_logprobs(logprobs, ids, [k] * ids.shape[0]))
    return out


def _count_greater_(x: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """Per row, how many entries of x [n, v] are > value [n, 1], as int64; x is overwritten.

    Arithmetic instead of a boolean mask (faster on the CPU): x - value > 0 exactly when
    x > value; value is clamped to the lowest float so that -inf - -inf never makes a NaN.
    """
    value = value.clamp(min=torch.finfo(x.dtype).min)
    return x.sub_(value).sign_().relu_().sum(-1).long()
