"""Sampled outputs keep their distribution under speculative decoding: a chi-square test of
homogeneity between the tokens drawn with and without ngram drafts (disjoint seeds, so two
independent samples) on a tiny model with a 400-token vocabulary, at every output position a
draft can cover. The test can fail: an acceptance rule that keeps every draft is rejected."""

from __future__ import annotations

import collections

import numpy as np
import pytest
from scipy.stats import chi2_contingency

from bench.common.tiny_models import write_gguf_llama
from pagedserve import LLM, SamplingParams
from pagedserve.core.runner import model_runner
from pagedserve.core.sched.scheduler import StepPlan
from pagedserve.core.spec_decode.verify import Verification

# Tokens the tiny model (seed 5) often samples, repeated so that its outputs match n-grams.
PROMPT = [67, 269, 48, 61, 195, 344, 212, 48, 61, 195, 226, 61, 209, 344, 219, 48, 195, 61, 212]
DRAWS = 1200
MAX_TOKENS = 4


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("spec_sampling") / "tiny.gguf"
    write_gguf_llama(path, seed=5)
    return str(path)


def draws(model: str, first_seed: int, speculate: bool) -> list[list[int]]:
    options: dict[str, object] = {"dtype": "float32", "num_pages": 2048, "page_size": 8}
    if speculate:
        options.update(speculative_method="ngram", ngram_min=1, speculative_max_batch=1024)
    llm = LLM(model, max_num_seqs=256, **options)
    params = [
        SamplingParams(temperature=1.0, top_k=6, seed=first_seed + i, max_tokens=MAX_TOKENS,
                       ignore_eos=True)
        for i in range(DRAWS)
    ]  # fmt: skip
    outputs = llm.generate([PROMPT] * DRAWS, params)
    if speculate:
        stats = llm.engine.stats().spec_decode
        assert stats is not None and stats.num_accepted_tokens > 50, stats  # drafts did work
    return [o.outputs[0].token_ids for o in outputs]


def p_value(a: list[int], b: list[int]) -> float:
    """Chi-square homogeneity of two samples of tokens (rare tokens pooled)."""
    counts_a, counts_b = collections.Counter(a), collections.Counter(b)
    common = [t for t in counts_a | counts_b if counts_a[t] + counts_b[t] >= 20]
    table = np.array([[counts[t] for t in common] for counts in (counts_a, counts_b)])
    rest = np.array([len(a), len(b)]) - table.sum(axis=1)  # the pooled rare tokens
    if rest.sum():
        table = np.column_stack([table, rest])
    return float(chi2_contingency(table)[1])


def p_values(model: str) -> list[float]:
    base, spec = draws(model, 0, speculate=False), draws(model, 10**6, speculate=True)
    values = []
    for pos in range(1, MAX_TOKENS):  # position 0 is never a draft's
        values.append(p_value([t[pos] for t in base], [t[pos] for t in spec]))
    pairs = [t[1] * 1000 + t[2] for t in base], [t[1] * 1000 + t[2] for t in spec]
    values.append(p_value(*pairs))  # and the joint of two drafted positions
    return values


def test_next_token_distributions_agree_with_and_without_speculation(model: str) -> None:
    values = p_values(model)
    assert min(values) > 1e-3, values  # Bonferroni over 4 tests at ~0.4% overall


def test_the_test_rejects_an_acceptance_rule_that_keeps_every_draft(
    model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def keep_all(plan: StepPlan, v: Verification, token_ids: np.ndarray) -> np.ndarray:
        accepted = np.zeros(plan.num_reqs, dtype=np.int32)
        ends = plan.query_start_loc
        for row, first, d in v.groups:
            token_ids[first : first + d] = plan.input_ids[int(ends[row + 1]) - d : ends[row + 1]]
            accepted[row] = d
        return accepted

    monkeypatch.setattr(model_runner, "num_accepted", keep_all)
    assert min(p_values(model)) < 1e-6
