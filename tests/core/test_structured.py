"""Constrained decoding in the engine (default model): outputs follow their grammar whatever
else shares the batch, with n > 1, seeds, logprobs, stop strings, the prefix cache and
preemption; unconstrained rows are left exactly as they were."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from pagedserve import LLM, SamplingParams
from pagedserve.core.models.resolve import ResolvedModel
from pagedserve.core.sampling_params import StructuredOutputs
from pagedserve.core.structured import GrammarCache, GrammarError, GrammarState
from pagedserve.core.structured.bitmask import GrammarMasker

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "colors": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "colors", "address"],
    "additionalProperties": False,
}
JSON_SPEC = StructuredOutputs("json_schema", json.dumps(SCHEMA))
PROMPTS = ["A person as JSON:", "Describe a user in JSON.", "JSON for Ada Lovelace:", "{"]


@pytest.fixture(scope="module")
def llm(default_model: ResolvedModel) -> LLM:
    return LLM(str(default_model.path), max_model_len=512, num_pages=256)


def constrained(**kwargs: object) -> SamplingParams:
    options: dict = {"temperature": 0, "max_tokens": 60, "structured": JSON_SPEC}
    options.update(kwargs)
    return SamplingParams(**options)


def check_json(text: str) -> None:
    jsonschema.validate(json.loads(text), SCHEMA)


def test_cache_compiles_once_and_evicts(llm: LLM) -> None:
    cache = GrammarCache(llm.engine.tokenizer, capacity=2)
    first = cache.compile(JSON_SPEC)
    assert cache.compile(StructuredOutputs("json_schema", json.dumps(SCHEMA))) is first
    assert cache.num_compiled == 1
    cache.compile(StructuredOutputs("regex", "[a-z]+"))
    cache.compile(StructuredOutputs("choice", json.dumps(["yes", "no"])))
    assert len(cache) == 2 and cache.compile(JSON_SPEC) is not first  # evicted, compiled again


@pytest.mark.parametrize(
    "spec",
    [
        StructuredOutputs("regex", "(unclosed", param="guided_regex"),
        StructuredOutputs("ebnf", "root ::= undefined_rule", param="guided_grammar"),
        StructuredOutputs("json_schema", "{not json", param="response_format"),
    ],
)
def test_bad_grammar_is_an_error_naming_the_field(llm: LLM, spec: StructuredOutputs) -> None:
    with pytest.raises(GrammarError) as err:
        llm.engine.grammars.compile(spec)
    assert err.value.param == spec.param


def test_mask_touches_only_constrained_rows(llm: LLM) -> None:
    vocab = llm.engine.tokenizer.vocab_size
    compiled = llm.engine.grammars.compile(StructuredOutputs("choice", json.dumps(["yes", "no"])))
    logits = torch.randn(3, vocab)
    masked = logits.clone()
    GrammarMasker().apply(masked, [1], [GrammarState(compiled)])
    assert torch.equal(masked[0], logits[0]) and torch.equal(masked[2], logits[2])
    allowed = torch.isfinite(masked[1]).nonzero()[:, 0].tolist()
    texts = {llm.engine.tokenizer.decode([t]) for t in allowed}
    assert allowed and all("yes".startswith(t) or "no".startswith(t) for t in texts), texts


def test_constrained_rows_follow_the_schema_in_a_mixed_batch(llm: LLM) -> None:
    free = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    alone = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, free)]
    outputs = llm.generate(PROMPTS * 2, [free] * len(PROMPTS) + [constrained()] * len(PROMPTS))
    assert [o.outputs[0].token_ids for o in outputs[: len(PROMPTS)]] == alone
    for out in outputs[len(PROMPTS) :]:
        assert out.outputs[0].finish_reason == "stop"
        check_json(out.outputs[0].text)


def test_n_seeds_logprobs_and_stop_strings(llm: LLM) -> None:
    params = constrained(n=3, temperature=0.8, seed=7, logprobs=2)
    [first] = llm.generate(PROMPTS[0], params)
    [again] = llm.generate(PROMPTS[0], params)
    assert [c.text for c in first.outputs] == [c.text for c in again.outputs]
    for choice in first.outputs:
        check_json(choice.text)
        assert len(choice.logprobs or []) == len(choice.token_ids)
    [stopped] = llm.generate(PROMPTS[0], constrained(stop=['"age"']))
    assert stopped.outputs[0].stop_reason == '"age"'
    assert stopped.outputs[0].text.startswith('{"name": "')


def test_max_tokens_ends_with_length(llm: LLM) -> None:
    out = llm.generate(PROMPTS[0], constrained(max_tokens=5))[0].outputs[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 5
    with pytest.raises(ValueError):
        json.loads(out.text)


def test_prefix_cache_and_preemption_keep_the_grammar_state(default_model: ResolvedModel) -> None:
    preamble = "You write JSON records about people, one per request, nothing else. " * 3
    prompts = [f"{preamble}{p} (person {i})" for i in range(2) for p in PROMPTS[:3]]
    roomy = LLM(str(default_model.path), max_model_len=512, num_pages=256)
    expected = [o.outputs[0].text for o in roomy.generate(prompts, constrained())]
    again = roomy.generate(prompts, constrained())  # prompts now in the prefix cache
    assert [o.outputs[0].text for o in again] == expected
    assert sum(o.metrics.num_cached_tokens for o in again if o.metrics) > 0
    tight = LLM(str(default_model.path), max_model_len=256, num_pages=24, page_size=16)
    got = [o.outputs[0].text for o in tight.generate(prompts, constrained())]
    assert tight.engine.stats().num_preemptions > 0
    assert got == expected
    for text in got:
        check_json(text)
