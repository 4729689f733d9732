"""The prefill cap while decoding (issue 12's mixed load): a step in which requests decode
carries at most `max_prefill_tokens_while_decoding` prompt tokens, a step with no decode the
whole `max_num_batched_tokens`; greedy tokens do not change; the config field and its flag."""

from __future__ import annotations

import numpy as np
import pytest

from pagedserve import LLM, SamplingParams
from pagedserve.cli_args import build_parser, configs_from_args, field_docs
from pagedserve.core.config import SchedulerConfig
from pagedserve.core.models.resolve import ResolvedModel
from pagedserve.core.sched.scheduler import Scheduler, StepPlan


def run_step(s: Scheduler) -> StepPlan:
    plan = s.schedule()
    s.update(plan, np.full(len(plan.logits_indices), 7, dtype=np.int32))
    return plan


def rows(plan: StepPlan) -> dict[int, int]:
    return dict(zip(plan.seq_ids.tolist(), plan.num_scheduled_tokens.tolist(), strict=True))


@pytest.mark.parametrize("cap", [None, 512, 24])
def test_prefill_tokens_capped_only_while_decoding(cap: int | None) -> None:
    s = Scheduler(num_pages=256, page_size=16, max_num_seqs=8, max_num_batched_tokens=512,
                  max_model_len=2048, enable_prefix_caching=False,
                  max_prefill_tokens_while_decoding=cap)  # fmt: skip
    for seq_id in range(4):
        s.add_request(seq_id, list(range(10 + seq_id, 30 + seq_id)), max_tokens=100)
    assert rows(run_step(s)) == {0: 20, 1: 20, 2: 20, 3: 20}  # nothing decodes: all at once
    s.add_request(10, list(range(1000, 1600)), max_tokens=100)  # 600-token prompts arrive
    s.add_request(11, list(range(2000, 2600)), max_tokens=100)
    limit = cap or 512
    done = 0
    for _ in range(60):
        plan = rows(run_step(s))
        assert all(plan[i] == 1 for i in range(4))  # every decoder, every step
        prefill = sum(n for i, n in plan.items() if i >= 10 and n > 1)
        assert prefill == min(limit, 512 - 4, 1200 - done)
        done += prefill
        if done == 1200:
            break
    assert done == 1200
    for seq_id in range(4):
        s.finish(seq_id)
    s.add_request(12, list(range(3000, 3600)), max_tokens=4)
    plan = rows(run_step(s))  # 10 and 11 decode: capped again
    assert plan[10] == plan[11] == 1 and plan[12] == min(limit, 510)
    s.finish(10)
    s.finish(11)
    plan = rows(run_step(s))  # nothing decodes: the whole budget
    assert plan == {12: min(600 - min(limit, 510), 512)}


def test_config_field_and_flag() -> None:
    assert SchedulerConfig().max_prefill_tokens_while_decoding >= 1
    with pytest.raises(ValueError, match="max_prefill_tokens_while_decoding"):
        SchedulerConfig(max_prefill_tokens_while_decoding=0)
    parser = build_parser()
    args = parser.parse_args(["serve", "--max-prefill-tokens-while-decoding", "64"])
    assert configs_from_args(args, {})[1].scheduler.max_prefill_tokens_while_decoding == 64
    with pytest.raises(ValueError, match="max_prefill_tokens_while_decoding"):
        args = parser.parse_args(["serve", "--max-prefill-tokens-while-decoding", "-1"])
        configs_from_args(args, {})
    serve = parser._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    text = " ".join(serve.format_help().split())
    doc = field_docs(SchedulerConfig)["max_prefill_tokens_while_decoding"]
    assert "--max-prefill-tokens-while-decoding" in text and " ".join(doc.split()[:8]) in text


def record_steps(scheduler: Scheduler) -> list[list[int]]:
    """Each schedule()'s tokens per row from now on."""
    steps: list[list[int]] = []
    schedule = scheduler.schedule

    def recording() -> StepPlan:
        plan = schedule()
        steps.append(plan.num_scheduled_tokens.tolist())
        return plan

    scheduler.schedule = recording  # type: ignore[method-assign]
    return steps


def test_long_prompt_next_to_decodes_gives_the_unconstrained_tokens(
    default_model: ResolvedModel,
) -> None:
    """A 200-token prompt joins 4 decoding requests; with 16 prefill tokens a step it takes
    many steps, each with every decode in it, and every request's greedy tokens equal the run
    with no cap (the native kernels are batch-invariant)."""
    outputs, prefill_next_to_decodes = {}, {}
    for cap in (256, 16):
        llm = LLM(str(default_model.path), max_model_len=1024, num_pages=128,
                  max_num_batched_tokens=256, max_prefill_tokens_while_decoding=cap)  # fmt: skip
        base = llm.tokenizer.encode("The engine decodes first and then fills its budget. " * 30)
        engine = llm.engine
        steps = record_steps(engine.scheduler)
        params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
        for i in range(4):
            engine.add_request(f"short-{i}", base[i : i + 12], params)
        engine.step()  # the short prompts prefill: they decode from now on
        engine.add_request("long", base[:200], SamplingParams(temperature=0, max_tokens=8))
        done: dict[str, list[int]] = {}
        while engine.has_unfinished():
            for out in engine.step():  # deltas
                for o in out.outputs:
                    done.setdefault(out.request_id, []).extend(o.token_ids)
        outputs[cap] = done
        prefill_next_to_decodes[cap] = max(sum(n for n in s if n > 1) for s in steps[1:])
        assert len(done["long"]) == 8 and engine.stats().num_used_pages == 0
    assert outputs[16] == outputs[256]
    assert prefill_next_to_decodes == {256: 200, 16: 16}
