"""What crosses the model runner's boundary besides tensors: the prompt-logprobs rows a step
asks for (PromptLogprobsSpec) and what a step returns (StepResult). numpy only, so the engine's
torch-free modules (engine/step_inputs.py, engine/output_processor.py) can name them."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pagedserve.core.outputs import TokenLogprob


@dataclass
class PromptLogprobsSpec:
    """Logprobs of prompt tokens for one request's prefill chunk (echo / prompt_logprobs)."""

    seq_id: int
    row_start: int
    """First token row of the chunk in the step's batch."""
    target_ids: list[int]
    """The prompt tokens that rows row_start.. predict (the chunk's next tokens)."""
    k: int


@dataclass
class StepResult:
    token_ids: np.ndarray
    """int32, one sampled token per entry of the plan's sample_seq_ids, in that order (a
    verification chunk's entries: the target's token at each of its positions)."""
    logprobs: list[TokenLogprob | None] | None
    """Per sampled row when any row asked (None for the rows that did not); None otherwise."""
    prompt_logprobs: dict[int, list[TokenLogprob]]
    """seq_id -> the logprobs of this step's prompt chunk (PromptLogprobsSpec.target_ids)."""
    embeddings: dict[int, list[float]] = field(default_factory=dict)
    """seq_id -> the vector of each embedding request whose prompt ended this step (its
    entry in token_ids is a placeholder 0)."""
    num_accepted: np.ndarray | None = None
    """int32 per plan row: the draft tokens each verification chunk keeps (None: no row of
    the step had drafts)."""
    verified: dict[int, tuple[int, int]] = field(default_factory=dict)
    """First logits entry of each verification chunk -> (its drafts, the drafts kept): its
    entries first..first + kept are the tokens it emits."""
