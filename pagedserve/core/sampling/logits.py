"""Sparse, in-place edits of a step's logits: logit_bias, min_tokens bans, penalties."""

from __future__ import annotations

import torch

from pagedserve.core.sampling.batch import LogitEdits


def apply_edits(logits: torch.Tensor, edits: LogitEdits) -> None:
    """Edit contiguous logits [n, vocab] in place, in vLLM's order.

    1. logit_bias: logit += bias.
    2. min_tokens: EOS and stop ids -> -inf while too few tokens were generated.
    3. repetition_penalty r on tokens of the prompt or the output: logit / r if logit > 0,
       else logit * r (HF / vLLM).
    4. frequency_penalty f and presence_penalty p on output tokens (OpenAI):
       logit - f * count - p.
    """
    flat = logits.view(-1)
    if edits.bias_index.numel():
        flat.index_add_(0, edits.bias_index, edits.bias)
    if edits.ban_index.numel():
        flat.index_fill_(0, edits.ban_index, float("-inf"))
    if edits.repetition_index.numel():
        seen = flat[edits.repetition_index]
        # A valid penalty can leave float32's range (5e-114 rounds to 0, 1e300 to inf): keep r
        # finite and nonzero, and cap a boosted logit at the largest float, so no NaN or +inf
        # reaches the softmax. -inf (a ban) stays -inf.
        finfo = torch.finfo(flat.dtype)
        r = edits.repetition.clamp(min=finfo.tiny, max=finfo.max)
        edited = torch.where(seen > 0, seen / r, seen * r).clamp_(max=finfo.max)
        flat[edits.repetition_index] = edited
    if edits.output_index.numel():
        emitted = flat[edits.output_index]
        flat[edits.output_index] = emitted - edits.frequency - edits.presence
