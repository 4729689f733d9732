"""The model families' cases (tests/core/models/test_families.py, bench/engine/family_sweep.py)
and their transformers oracle: greedy tokens with each step's top-2 logit gap, and the comparison
that stops at the first near-tie (a near-tie is not a bug)."""

from __future__ import annotations

from pathlib import Path

import torch

from pagedserve import SamplingParams

NEAR_TIE = 1e-3
LONGROPE = {
    "rope_type": "longrope",
    "short_factor": [1.0 + 0.1 * i for i in range(8)],
    "long_factor": [2.0 + 0.5 * i for i in range(8)],
}
# (family, config overrides); sliding windows are 8 tokens, prompts run past them.
CASES = {
    "qwen3": ("qwen3", {}),
    "qwen3-attention-bias": ("qwen3", {"attention_bias": True}),  # q/k/v and o_proj biases
    "qwen3_moe": ("qwen3_moe", {}),
    "qwen3_moe-unnormalized": ("qwen3_moe", {"norm_topk_prob": False}),
    "qwen2_moe-shared": ("qwen2_moe", {}),
    "mixtral": ("mixtral", {}),
    "gemma2-no-window": ("gemma2", {"sliding_window": 4096}),  # >= the context: full
    "gemma3-no-window": ("gemma3_text", {"sliding_window": 4096, "num_hidden_layers": 3,
                         "layer_types": ["sliding_attention", "full_attention",
                                         "sliding_attention"]}),
    "gemma3-attention-bias": ("gemma3_text", {"sliding_window": 4096, "attention_bias": True}),
    "phi3": ("phi3", {}),
    "phi3-longrope": ("phi3", {"rope_scaling": LONGROPE}),
    "llama3-rope": ("llama", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                    "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 8}}),
}  # fmt: skip
# These need the paged kernels' sliding window / logit soft-capping.
WINDOW_CASES = {
    "mistral-window": ("mistral", {"sliding_window": 8}),
    "mixtral-window": ("mixtral", {"sliding_window": 8}),
    "gemma2": ("gemma2", {"attn_logit_softcapping": 50.0}),
    "gemma3": ("gemma3_text", {"num_hidden_layers": 3, "layer_types": ["sliding_attention",
               "full_attention", "sliding_attention"]}),
    "qwen3-window": ("qwen3", {"use_sliding_window": True, "sliding_window": 8,
                     "layer_types": ["sliding_attention", "full_attention"]}),
}  # fmt: skip
PROMPT = [3, 17, 42, 99, 7, 250, 11, 64, 128, 5, 77, 31, 200, 9, 14, 300, 21, 8]


def hf_greedy(hf_model, prompt: list[int], max_new_tokens: int) -> tuple[list[int], list[float]]:
    """transformers' greedy tokens (fp32, its own KV cache) and each step's top-2 gap."""
    with torch.no_grad():
        out = hf_model.generate(
            torch.tensor([prompt]),
            do_sample=False,
            max_new_tokens=max_new_tokens,
            min_new_tokens=max_new_tokens,
            eos_token_id=None,
            pad_token_id=0,
            output_logits=True,
            return_dict_in_generate=True,
        )
    tokens = out.sequences[0, len(prompt) :].tolist()
    gaps = []
    for logits in out.logits:
        top2 = logits[0].float().topk(2).values
        gaps.append(float(top2[0] - top2[1]))
    return tokens, gaps


def trusted_prefix(tokens: list[int], gaps: list[float]) -> list[int]:
    """The tokens up to (excluding) the first step whose top-2 gap is a near-tie."""
    cut = next((i for i, gap in enumerate(gaps) if gap < NEAR_TIE), len(tokens))
    return tokens[:cut]


def assert_greedy_matches(ours: list[int], expected: list[int], gaps: list[float]) -> int:
    """ours equals transformers' tokens up to the first near-tie; returns how many compared."""
    trusted = trusted_prefix(expected, gaps)
    assert ours[: len(trusted)] == trusted, (ours, expected, gaps)
    return len(trusted)


def engine_prompts(prompt: list[int]) -> list[list[int]]:
    """Shorter and longer than an 8-token window; the third shares the second's first 12
    tokens (three full 4-token pages: a prefix-cache hit once the second has run)."""
    return [prompt[:5], prompt, prompt[:12] + [33, 44, 55]]


def assert_engine_matches(llm, hf_model, prompt: list[int], max_tokens: int = 12) -> None:
    """The engine's greedy tokens for engine_prompts(prompt), as one mixed batch and then the
    third alone (a prefix-cache hit), equal transformers' up to each first near-tie."""
    greedy = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    prompts = engine_prompts(prompt)
    batch = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy)]
    alone = llm.generate([prompts[2]], greedy)[0].outputs[0].token_ids
    compared = 0
    for one, ours in zip(prompts + [prompts[2]], batch + [alone], strict=True):
        compared += assert_greedy_matches(ours, *hf_greedy(hf_model, one, max_tokens))
    assert compared >= 2 * max_tokens  # most steps are not near-ties: the comparison is real


def load_hf(folder: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
