"""The transformers oracle for the model families: greedy tokens with each step's top-2 logit
gap, and the comparison that stops at the first near-tie (a near-tie is not a bug)."""

from __future__ import annotations

from pathlib import Path

import torch

from pagedserve import SamplingParams

NEAR_TIE = 1e-3


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
