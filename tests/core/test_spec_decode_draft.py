"""The draft model (--speculative-method draft): greedy tokens equal the target's alone, with
a draft that always agrees (the target itself) and one that never does (another random model
of the same tokenizer), batched, under preemptions; its KV pool comes back empty; a draft of
another vocabulary is refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.common.tiny_models import write_gguf_llama
from pagedserve import LLM, SamplingParams

PROMPTS = [
    "the quick brown fox jumps over the lazy dog; the quick brown fox jumps over the",
    "hello world, this is",
    "a b c d e f g a b c d e f g a b c d",
]
GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    folder = tmp_path_factory.mktemp("draft")
    write_gguf_llama(folder / "target.gguf", seed=5)
    write_gguf_llama(folder / "other.gguf", seed=6)
    return str(folder / "target.gguf"), str(folder / "other.gguf")


def tokens(llm: LLM, params: SamplingParams = GREEDY) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]


@pytest.mark.parametrize("num_pages", [128, 12])  # 12: the requests preempt one another
def test_greedy_equal_with_an_agreeing_and_a_disagreeing_draft(
    models: tuple[str, str], num_pages: int
) -> None:
    target, other = models
    options = {"dtype": "float32", "num_pages": num_pages, "page_size": 8}
    want = tokens(LLM(target, **options))
    for draft, accepted in ((target, True), (other, False)):
        llm = LLM(target, **options, speculative_method="draft", speculative_model=draft,
                  speculative_max_batch=64)  # fmt: skip
        assert tokens(llm) == want
        stats = llm.engine.stats()
        spec = stats.spec_decode
        assert spec is not None and spec.num_drafts > 0
        if accepted:  # the target as its own draft: every draft token is right
            assert spec.num_accepted_tokens == spec.num_draft_tokens
        assert stats.num_used_pages == 0
        draft_model = llm.engine.model_runner.draft
        assert draft_model is not None and not draft_model._seqs  # every sequence released
        params = SamplingParams(temperature=0.8, seed=4, max_tokens=30, ignore_eos=True)
        assert tokens(llm, params) == tokens(LLM(target, **options), params)  # seeded: same


def test_a_draft_of_another_vocabulary_is_refused(models: tuple[str, str], tmp_path: Path) -> None:
    from bench.common.tiny_models import write_hf_model
    from bench.common.tiny_tokenizers import write_tiny_spm

    folder = tmp_path / "spm"
    write_tiny_spm(folder)
    write_hf_model(folder, "llama", seed=1, vocab_size=123)
    with pytest.raises(ValueError, match="speculative_model"):
        LLM(models[0], dtype="float32", num_pages=32, speculative_method="draft",
            speculative_model=str(folder))  # fmt: skip
