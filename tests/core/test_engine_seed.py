"""--seed (ModelConfig.seed) seeds the generator that requests without their own seed draw
from: the same request sequence gives the same tokens from run to run, another seed other
tokens; a request's own seed still decides alone."""

from __future__ import annotations

import pytest

from bench.common.tiny_models import write_gguf_llama
from pagedserve import LLM, SamplingParams

PROMPTS = ["the quick brown fox", "hello world, this is", "Once upon a time 42", "abc"]
SAMPLED = SamplingParams(temperature=1.0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("seed") / "tiny.gguf"
    write_gguf_llama(path, seed=11)
    return str(path)


def _run(model: str, seed: int, params: SamplingParams = SAMPLED) -> list[list[int]]:
    """A fresh engine (a new process would start the same way) and one request sequence."""
    llm = LLM(model, dtype="float32", num_pages=64, page_size=8, seed=seed)
    first = llm.generate(PROMPTS[:2], params)  # two batches in a row: the generator moves on
    second = llm.generate(PROMPTS, params)
    return [o.outputs[0].token_ids for o in first + second]


def test_unseeded_requests_repeat_under_the_same_seed(model: str) -> None:
    runs = [_run(model, seed) for seed in (7, 7, 8)]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]
    # the generator is shared and moves on: the first batch's draws differ from the second's
    assert runs[0][:2] != runs[0][2:4]


def test_a_request_seed_overrides_the_server_seed(model: str) -> None:
    own = SamplingParams(temperature=1.0, max_tokens=24, ignore_eos=True, seed=5)
    assert _run(model, 7, own) == _run(model, 8, own)
