"""What a step's plan asks of the model runner besides its tokens: which sequences sample a
token, which prompt rows want their logprobs, which chunks of embedding requests pool. Pure
functions of the plan and the engine's sequence table (LLMEngine calls them once a step)."""

from __future__ import annotations

from collections.abc import Mapping

from pagedserve.core.pooling_params import PoolerConfig, PoolingSpec
from pagedserve.core.request import Sequence
from pagedserve.core.runner.step_result import PromptLogprobsSpec
from pagedserve.core.sched.scheduler import StepPlan


def sampling_seqs(plan: StepPlan, seqs: Mapping[int, Sequence]) -> list[Sequence]:
    """The sequences that sample a token this step, in the plan's order (embedding
    requests pool instead)."""
    planned = (seqs[seq_id] for seq_id in plan.sample_seq_ids.tolist())
    return [seq for seq in planned if seq.request.pooling is None]


def pooling_specs(
    plan: StepPlan, seqs: Mapping[int, Sequence], pooler: PoolerConfig | None
) -> list[PoolingSpec]:
    """The chunks of embedding requests in this step (last pooling needs only the final
    one; mean and cls every one)."""
    if pooler is None:
        return []
    every_chunk = pooler.uses_every_token
    specs = []
    for i, seq_id in enumerate(plan.seq_ids.tolist()):
        request = seqs[seq_id].request
        if request.pooling is None:
            continue
        start, num_rows = int(plan.num_computed_tokens[i]), int(plan.num_scheduled_tokens[i])
        last = start + num_rows >= len(request.prompt_token_ids)
        if last or every_chunk:
            row_start = int(plan.query_start_loc[i])
            dims = request.pooling.dimensions
            specs.append(PoolingSpec(seq_id, row_start, num_rows, start, last, dims))
    return specs


def prompt_logprobs_specs(plan: StepPlan, seqs: Mapping[int, Sequence]) -> list[PromptLogprobsSpec]:
    """The prompt rows of this step whose logprobs a request asked for (output 0 only, until
    they have been sent)."""
    specs = []
    for i, seq_id in enumerate(plan.seq_ids.tolist()):
        seq = seqs[seq_id]
        request = seq.request
        if request.prompt_logprobs is None or seq.index != 0 or request.prompt_logprobs_sent:
            continue
        start = int(plan.num_computed_tokens[i])
        num_prompt = len(request.prompt_token_ids)
        if start >= num_prompt:
            continue
        end = min(start + int(plan.num_scheduled_tokens[i]) + 1, num_prompt)
        specs.append(
            PromptLogprobsSpec(
                seq_id=seq_id,
                row_start=int(plan.query_start_loc[i]),
                target_ids=request.prompt_token_ids[start + 1 : end],
                k=request.params.prompt_logprobs or 0,
            )
        )
    return specs
