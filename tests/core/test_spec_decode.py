"""Speculative decoding (ngram) keeps greedy tokens exactly: tiny models in float32 and the
CPU's default dtype, alone and batched with sequences that never speculate, under a small KV
pool (preemptions), through prefix-cache hits, with logprobs, stop strings, max_tokens, n > 1,
grammars and seeded sampling; every page comes back and only verified tokens are cached."""

from __future__ import annotations

import pytest

from bench.common.tiny_models import write_gguf_llama, write_hf_model
from bench.common.tiny_tokenizers import write_tiny_bpe
from pagedserve import LLM, SamplingParams
from pagedserve.core.models.resolve import ResolvedModel
from pagedserve.core.spec_decode.ngram import NgramIndex

REPEATING = [
    "the quick brown fox jumps over the lazy dog; the quick brown fox jumps over the",
    "def f(x): return x + 1\ndef g(x): return x + 1\ndef h(x): return",
    "a b c d e f g a b c d e f g a b c d",
]
PLAIN = ["hello world, this is", "Once upon a time 42", "zebra"]
GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
SPEC = {"speculative_method": "ngram", "num_speculative_tokens": 4, "speculative_max_batch": 64}


@pytest.fixture(scope="module")
def gguf(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("spec") / "tiny.gguf"
    write_gguf_llama(path, seed=5)
    return str(path)


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory: pytest.TempPathFactory) -> str:
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("spec_hf") / "model"
    write_tiny_bpe(folder)
    write_hf_model(folder, "qwen2", seed=3, vocab_size=len(AutoTokenizer.from_pretrained(folder)))
    return str(folder)


def tokens(llm: LLM, prompts: list[str], params: SamplingParams = GREEDY) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


def engines(model: str, **kwargs: object) -> tuple[LLM, LLM]:
    options: dict[str, object] = {"num_pages": 128, "page_size": 8, **kwargs}
    return LLM(model, **options), LLM(model, **options, **SPEC)


# ---- the proposer --------------------------------------------------------------------------


def test_ngram_proposes_the_continuation_of_the_longest_latest_match() -> None:
    index = NgramIndex([1, 2, 3, 4, 5, 9, 2, 3, 7, 1, 2], ngram_min=1, ngram_max=3)
    assert index.propose([], 3) == [3, 4, 5]  # "1 2" occurred at the start only
    assert index.propose([3], 2) == [4, 5]  # "1 2 3"
    assert index.propose([3, 8], 2) == []  # "8", "3 8" never occurred
    assert NgramIndex([5, 6, 5, 6], 2, 2).propose([], 5) == [5, 6, 5, 6, 5]  # the repeat goes on
    assert NgramIndex([1, 2, 3], 2, 4).propose([], 2) == []


# ---- greedy equality -------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "auto"])
def test_greedy_tokens_equal_without_speculation_batched_with_plain_requests(
    gguf: str, hf_folder: str, dtype: str
) -> None:
    for model in (gguf, hf_folder):
        base, spec = engines(model, dtype=dtype)
        prompts = REPEATING + PLAIN
        want = tokens(base, prompts)
        assert tokens(spec, prompts) == want
        assert [tokens(spec, [p])[0] for p in prompts[:2]] == want[:2]  # alone
        stats = spec.engine.stats().spec_decode
        assert stats is not None and stats.num_accepted_tokens > 0, stats


def test_greedy_equal_across_preemption_and_prefix_cache_hits(gguf: str) -> None:
    # 14 pages of 8 tokens for 6 requests of ~30 + 40 tokens: they preempt one another.
    base, spec = engines(gguf, dtype="float32", num_pages=14, max_num_batched_tokens=32)
    prompts = REPEATING * 2
    want = tokens(base, prompts)
    assert tokens(spec, prompts) == want
    assert spec.engine.stats().num_preemptions > 0
    roomy = LLM(gguf, dtype="float32", num_pages=128, page_size=8, **SPEC)
    assert tokens(roomy, REPEATING) == want[:3]
    assert roomy.engine.stats().prefix_hit_tokens == 0
    assert tokens(roomy, REPEATING) == want[:3]  # now from cached prompt (and output) pages
    assert roomy.engine.stats().prefix_hit_tokens > 0


def test_logprobs_stops_max_tokens_and_n_as_without(gguf: str) -> None:
    base, spec = engines(gguf, dtype="float32")
    params = [
        SamplingParams(temperature=0, max_tokens=7, logprobs=2, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=33, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, n=2),
    ]
    for p in params:
        a, b = base.generate(REPEATING, p), spec.generate(REPEATING, p)
        for x, y in zip(a, b, strict=True):
            assert [o.token_ids for o in x.outputs] == [o.token_ids for o in y.outputs]
            assert all(len(o.token_ids) == p.max_tokens for o in y.outputs)  # never past it
            assert [o.text for o in x.outputs] == [o.text for o in y.outputs]
            if p.logprobs:
                got = [(lp.token_id, round(lp.logprob, 4)) for lp in y.outputs[0].logprobs or []]
                ref = [(lp.token_id, round(lp.logprob, 4)) for lp in x.outputs[0].logprobs or []]
                assert got == ref
    # a stop string inside an accepted run ends the output where it would have
    full = base.generate(REPEATING[:1], GREEDY)[0].outputs[0].text
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    stopped = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop=[stop])
    a, b = base.generate(REPEATING, stopped), spec.generate(REPEATING, stopped)
    assert [o.outputs[0].text for o in a] == [o.outputs[0].text for o in b]
    assert [o.outputs[0].finish_reason for o in a] == [o.outputs[0].finish_reason for o in b]


def test_seeded_sampling_gives_the_same_tokens_with_and_without(gguf: str) -> None:
    """Each output position draws from a generator of (seed, position): the tokens are a
    function of the request alone, whatever the drafts did."""
    base, spec = engines(gguf, dtype="float32")
    params = SamplingParams(temperature=0.7, top_k=8, seed=3, max_tokens=40, ignore_eos=True)
    assert tokens(spec, REPEATING, params) == tokens(base, REPEATING, params)
    stats = spec.engine.stats().spec_decode
    assert stats is not None and stats.num_drafts > 0


def test_grammar_cuts_drafts_and_keeps_the_tokens(gguf: str) -> None:
    import json

    from pagedserve.core.sampling_params import StructuredOutputs

    base, spec = engines(gguf, dtype="float32")
    choices = ["the quick brown fox jumps", "the lazy dog", "a b c d e f g a b c"]
    structured = StructuredOutputs("choice", json.dumps(choices))
    params = SamplingParams(temperature=0, max_tokens=30, structured=structured)
    a = base.generate(REPEATING, params)
    b = spec.generate(REPEATING, params)
    assert [o.outputs[0].token_ids for o in a] == [o.outputs[0].token_ids for o in b]
    assert all(o.outputs[0].text in choices for o in b)


# ---- pages -------------------------------------------------------------------------------------


def test_pages_come_back_and_only_verified_pages_are_cached(gguf: str) -> None:
    llm = LLM(gguf, dtype="float32", num_pages=512, page_size=4, **SPEC)
    prompts = [f"{i} " + REPEATING[i % 3] + f" {i}" for i in range(24)]  # no shared pages
    params = [
        SamplingParams(temperature=0 if i % 2 else 0.8, seed=i, max_tokens=10 + i, ignore_eos=True)
        for i in range(24)
    ]
    outputs = llm.generate(prompts, params)
    stats = llm.engine.stats()
    assert stats.num_used_pages == 0
    assert stats.num_free_pages + stats.num_cached_pages == stats.num_pages
    assert stats.spec_decode is not None and stats.spec_decode.num_drafts > 0
    # Every full page of verified KV (prompt + output less the last token) is cached, and no
    # page more: a page holding a rejected draft would be one too many.
    verified = sum(
        (len(o.prompt_token_ids) + len(o.outputs[0].token_ids) - 1) // 4 for o in outputs
    )
    assert stats.num_cached_pages == verified


# ---- the default model ---------------------------------------------------------------------


def test_default_model_greedy_equal_on_a_repeating_prompt(default_model: ResolvedModel) -> None:
    """SmolLM2-135M (Q4_1, the default dtype: batch-invariant kernels), a rewrite of code it
    was shown, batched with a prompt that gives nothing to copy."""
    code = "\n".join(f"    total = total + values[{i}] * {i + 1}" for i in range(12))
    prompts = [
        f"def weighted(values):\n    total = 0\n{code}\n    return total\n\n"
        f"# The same function, unchanged:\ndef weighted(values):\n    total = 0\n",
        "The capital of France is",
    ]
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    base, spec = engines(str(default_model.path), max_model_len=512)
    want = tokens(base, prompts, params)
    assert tokens(spec, prompts, params) == want
    stats = spec.engine.stats().spec_decode
    assert stats is not None and stats.num_accepted_tokens >= 8, stats


# ---- the back-off rule -------------------------------------------------------------------------


def test_draft_length_follows_acceptance_and_batch_size() -> None:
    from pagedserve.core.spec_decode.speculator import draft_length, threshold

    assert [threshold(b) < threshold(2 * b) for b in (1, 4, 16)] == [True] * 3
    assert draft_length(0.9, 1, 4) == 4 and draft_length(0.9, 32, 4) == 4  # copying: always
    assert draft_length(0.3, 1, 4) == 1 and draft_length(0.3, 32, 4) == 0  # guessing: alone
    assert [draft_length(0.7, b, 4) for b in (1, 4, 8, 64)] == [4, 3, 2, 1]


def test_a_sequence_whose_drafts_fail_pauses_then_probes() -> None:
    from types import SimpleNamespace

    from pagedserve.core.config import SpeculativeConfig
    from pagedserve.core.spec_decode.speculator import Speculator

    proposed: list[list[int]] = []
    speculator = Speculator(
        SpeculativeConfig(speculative_method="ngram", ngram_min=1),
        lambda seq_id, draft: proposed.append(draft),
    )
    request = SimpleNamespace(prompt_token_ids=[1, 2, 3] * 10, max_tokens=1000, pooling=None)
    seq = SimpleNamespace(seq_id=0, request=request, output_token_ids=[1], finished=False,
                          grammar=None)  # fmt: skip
    lengths = []
    for _ in range(40):  # every draft rejected at its first token
        proposed.clear()
        speculator.propose([seq], num_running=8)  # type: ignore[list-item]
        lengths.append(len(proposed[0]) if proposed else 0)
        if proposed:
            speculator.observe(0, len(proposed[0]), 0)
    assert lengths[0] >= 2  # the prior: drafts are worth trying
    assert lengths.count(0) > 25  # then mostly paused
    assert lengths[-20:].count(1) >= 1  # with one-token probes
