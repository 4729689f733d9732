"""Issue 24: the engine's tokens on every ISA path this CPU can run, each forced at start-up
(cpu_isa, as `--cpu-isa` does), the levels above the CPU's skipped by the cpu_isa fixture.

- The default model as users run it (Q4_1 kept quantized, int8 activations, the default
  --deterministic): every level gives the best level's greedy tokens, and the same logprobs bit
  for bit on the best level's whole sequence. The levels are built to give the same bits (the
  quantized kernels fold in one order, the layer ops are torch's expressions, the attention
  rounds alike: attention/kernels.hpp); a last-bit difference anywhere would show here, since
  int8 activations turn one into different tokens within a few layers.
- A tiny Llama in fp32 through LLM(...) against transformers in fp32 (the family oracle) at
  each level: attention, norms, rotary and SiLU-and-mul on that level's kernels; and the families
  that need the paged kernels' sliding window or soft cap (Mistral, Mixtral, Gemma 2 and 3,
  Qwen3 with a window: the ones issue 24 saw disagree on an AVX2-only CPU) at each level too.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.common.family_oracle import PROMPT, WINDOW_CASES, assert_engine_matches, load_hf
from bench.common.tiny_models import write_hf_model
from bench.common.tiny_tokenizers import write_tiny_bpe
from pagedserve import LLM, SamplingParams
from pagedserve.core.models.resolve import ResolvedModel
from pagedserve.core.ops.cpu_features import (
    CPU_ISAS,
    cpu_isa_supported,
    forced_cpu_isa,
    runnable_isas,
)
from tests.core.models.test_default_model import CHAT_PROMPT, TEXT_PROMPT

MAX_TOKENS = 16
"""The best level's greedy tokens; the others score them and decode the first DECODED anew (the
portable level's scalar int8 kernel makes each decode step slow)."""
DECODED = 4
PROMPTS = [CHAT_PROMPT, TEXT_PROMPT]
Scores = list[list[tuple[float, int]]]


def default_llm(model_path: str, level: str, prefix_cache: bool = False) -> LLM:
    # One LLM per level: whatever KV its prefix cache holds, that level computed.
    return LLM(model_path, cpu_isa=level, dtype="float32", num_pages=64, page_size=16,
               enable_prefix_caching=prefix_cache)  # fmt: skip


def greedy(llm: LLM, max_tokens: int) -> list[list[int]]:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]


def scores(llm: LLM, sequences: list[list[int]]) -> Scores:
    """Each position's logprob of the sequence's token and the most likely token there, given
    the prefix (teacher-forced: the same positions on every level, prefill and all)."""
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=1)
    got = []
    for out in llm.generate(sequences, params):
        assert out.prompt_logprobs is not None
        got.append([(lp.logprob, lp.top[0][0]) for lp in out.prompt_logprobs if lp is not None])
    return got


@pytest.fixture(scope="module")
def best_level(default_model) -> tuple[list[list[int]], Scores]:
    llm = default_llm(str(default_model.path), cpu_isa_supported())
    assert "kept quantized" in llm.engine.model_info.weights  # the int8 kernels are compared
    tokens = greedy(llm, MAX_TOKENS)
    got = scores(llm, [p + t for p, t in zip(PROMPTS, tokens, strict=True)])
    llm.close()
    return tokens, got


@pytest.mark.parametrize("cpu_isa", CPU_ISAS, indirect=True)
def test_default_model_same_tokens_and_logprobs_on_every_level(
    cpu_isa: str, default_model, best_level: tuple[list[list[int]], Scores]
) -> None:
    want_tokens, want_scores = best_level
    # The greedy run decodes on the prompts' full pages that the scoring computed (cached), so
    # the portable level's scalar int8 kernel does not prefill the prompts twice.
    llm = default_llm(str(default_model.path), cpu_isa, prefix_cache=True)
    assert f"isa {cpu_isa} " in llm.engine.model_info.weights  # the level really ran
    got_scores = scores(llm, [p + t for p, t in zip(PROMPTS, want_tokens, strict=True)])
    tokens = greedy(llm, DECODED)
    llm.close()
    # Bit for bit at every position of prompt + 16 tokens; the top token at each of the 16 is
    # the greedy one, so this level's greedy run would give the same 16 tokens.
    assert got_scores == want_scores
    assert tokens == [t[:DECODED] for t in want_tokens]


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("llama")
    write_tiny_bpe(folder)
    write_hf_model(folder, "llama", seed=13)
    return folder


@pytest.mark.parametrize("cpu_isa", CPU_ISAS, indirect=True)
def test_tiny_llama_matches_transformers_on_every_level(cpu_isa: str, tiny_llama: Path) -> None:
    # 8 tokens per step: chunked prefill; page_size 4: windows straddle pages.
    llm = LLM(str(tiny_llama), cpu_isa=cpu_isa, dtype="float32", num_pages=64, page_size=4,
              max_num_batched_tokens=8)  # fmt: skip
    assert f"isa {cpu_isa} " in llm.engine.model_info.weights
    assert_engine_matches(llm, load_hf(tiny_llama), PROMPT)


@pytest.mark.parametrize(
    ("family", "config"), [pytest.param(*v, id=k) for k, v in WINDOW_CASES.items()]
)
@pytest.mark.parametrize("seed", [21, 22, 23])
def test_window_families_match_transformers_on_every_level(
    cpu_isa: str, tmp_path: Path, family: str, config: dict, seed: int
) -> None:
    folder = tmp_path / "m"
    write_tiny_bpe(folder)
    write_hf_model(folder, family, seed=seed, **config)
    llm = LLM(str(folder), cpu_isa=cpu_isa, dtype="float32", num_pages=64, page_size=4,
              max_num_batched_tokens=8)  # fmt: skip
    assert_engine_matches(llm, load_hf(folder), PROMPT)


@pytest.mark.parametrize(
    ("level", "quantization", "activations", "want"),
    [
        ("portable", "auto", "int8", "float32"),
        ("avx2", "auto", "int8", "bfloat16"),
        ("avx2", "auto", "auto", "float32"),  # the default model: int16, so float32
        ("avx2", "none", "auto", "bfloat16"),
        ("portable", "none", "auto", "float32"),
    ],
)
def test_auto_dtype_below_avx512_bf16(
    default_model: ResolvedModel, level: str, quantization: str, activations: str, want: str
) -> None:
    """--dtype auto without AVX512-BF16: from level avx2 bf16 storage, for weights kept quantized
    with int8 activations and dense ones alike (their kernels widen it and compute in fp32);
    float32 below it, where the dense linears run torch's matmul (its bf16 one is slow there),
    and for weights kept quantized with int16 activations (the default model's: their precision
    would be lost in bf16 storage)."""
    if level not in runnable_isas():
        pytest.skip(f"this CPU runs ISA levels up to {cpu_isa_supported()}, not {level}")
    with forced_cpu_isa(level):  # LLM(cpu_isa=...) sets the process-wide level: restored after
        llm = LLM(str(default_model.path), cpu_isa=level, quantization=quantization,
                  quantized_activations=activations, num_pages=16)  # fmt: skip
    assert llm.engine.model_info.dtype == want
