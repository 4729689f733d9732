"""Same request, same tokens (issue 16), on the default model in bfloat16 (the native CPU path:
packed linear kernel, native attention, the native decoder stack) and float32: each prompt
alone, in a batch of 32 mixed lengths, again after its prefix is cached, under a token budget
that chunks it differently, and after forced preemptions gives the same greedy tokens exactly;
so does a seeded sampled request."""

from __future__ import annotations

import pytest

from pagedserve import LLM, SamplingParams
from pagedserve.core.models.resolve import ResolvedModel
from pagedserve.core.ops.cpu_features import isa_at_least

# The default model's linears stay quantized: the int8 kernels are native at every level, and
# from avx2 on fast enough for this module (bf16 storage there since issue 24's --dtype auto).
pytestmark = pytest.mark.skipif(
    not isa_at_least("avx2"), reason="the portable int8 kernel is too slow for this module"
)

GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
SEEDED = SamplingParams(temperature=0.8, top_p=0.95, seed=7, max_tokens=16, ignore_eos=True)
CHECKED = (0, 2, 9, 20)  # 9, 91, 15 and 103 tokens: run alone too (a handful keeps it short)


def make_llm(model: ResolvedModel, dtype: str, **kwargs: object) -> LLM:
    options: dict[str, object] = {"dtype": dtype, "max_model_len": 1024, "num_pages": 512}
    options.update(kwargs)
    return LLM(str(model.path), **options)


def prompts_of(llm: LLM) -> list[list[int]]:
    """32 prompts of 9..~130 tokens cut from one text at varied offsets."""
    base = llm.tokenizer.encode(
        "A user asked the same question twice at temperature zero and expected one answer; "
        "the server batched it with others, chunked its prompt and found its prefix cached. " * 14
    )
    return [base[(11 * i) % 50 : (11 * i) % 50 + 9 + (41 * i) % 121] for i in range(32)]


def tokens(outputs: list) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


def run(llm: LLM, prompt: list[int]) -> list[list[int]]:
    """The prompt's greedy tokens, then its seeded sampled tokens: each request alone."""
    return [tokens(llm.generate([prompt], params))[0] for params in (GREEDY, SEEDED)]


@pytest.fixture(scope="module", params=["bfloat16", "float32"])
def dtype(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def alone(default_model: ResolvedModel, dtype: str) -> tuple[LLM, list[list[int]], list]:
    """The reference: each checked prompt alone on a fresh engine (no cache hits yet)."""
    llm = make_llm(default_model, dtype, enable_prefix_caching=False)
    assert llm.engine.batch_invariant  # what the start-up line and /v1/models report
    prompts = prompts_of(llm)
    want = {i: run(llm, prompts[i]) for i in CHECKED}
    return llm, prompts, want


def test_in_a_batch_of_32_then_after_the_prefix_is_cached(
    default_model: ResolvedModel, dtype: str, alone
) -> None:
    _, prompts, want = alone
    llm = make_llm(default_model, dtype)
    everything = tokens(llm.generate(prompts, GREEDY))
    for i in CHECKED:
        assert everything[i] == want[i][0], i
    hits = llm.engine.stats().prefix_hit_tokens
    for i in CHECKED:  # every full page of the prompt is cached now
        assert run(llm, prompts[i]) == want[i], i
    assert llm.engine.stats().prefix_hit_tokens > hits


@pytest.mark.parametrize(
    "options",
    [
        {"max_num_batched_tokens": 24},  # chunks of another size, decodes mixed in
        {"num_pages": 16, "page_size": 16, "max_model_len": 160},  # preemption and recompute
    ],
    ids=["token-budget", "preemption"],
)
def test_other_chunking_and_preemption(
    default_model: ResolvedModel, dtype: str, alone, options: dict
) -> None:
    _, prompts, want = alone
    llm = make_llm(default_model, dtype, **options)
    # The checked prompts next to the longest others, so budgets bind and pages run out.
    longest = sorted(range(32), key=lambda i: -len(prompts[i]))[:4]
    indices = (*CHECKED, *(i for i in longest if i not in CHECKED))
    got = tokens(llm.generate([prompts[i] for i in indices], GREEDY))
    for k, i in enumerate(CHECKED):
        assert got[k] == want[i][0], i
    if "num_pages" in options:
        assert llm.engine.stats().num_preemptions > 0
    for i in CHECKED[:2]:
        assert run(llm, prompts[i]) == want[i], i  # and the seeded request alone


def test_no_deterministic_trades_invariance_for_the_fast_decode(
    default_model: ResolvedModel,
) -> None:
    """deterministic=False (--no-deterministic) reaches the native decoder stack's attention and
    is reported; the prompt's own prefill (8+ query vectors: the invariant scoring either way)
    gives the same first token as the deterministic engine."""
    fast = make_llm(default_model, "bfloat16", deterministic=False)
    assert not fast.engine.batch_invariant
    stack = fast.engine.model_runner.model.stack
    assert stack is not None and not stack.batch_invariant
    prompt = prompts_of(fast)[9]
    got = tokens(fast.generate([prompt], GREEDY))[0]
    sure = make_llm(default_model, "bfloat16")
    assert sure.engine.model_runner.model.stack.batch_invariant
    want = tokens(sure.generate([prompt], GREEDY))[0]
    assert len(got) == len(want) == GREEDY.max_tokens and got[0] == want[0]
