"""What the LoRA tests share: prompts, the adapters written on the tiny Llama, transformers'
greedy tokens, and ours through `LLM`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from bench.common.tiny_lora import ATTENTION, MLP
from pagedserve import LLM, SamplingParams
from pagedserve.core.lora_request import LoRARequest

PROMPTS = ["the quick brown fox", "hello world, this is", "Once upon a time 42"]
NUM_TOKENS = 16
GREEDY = SamplingParams(temperature=0, max_tokens=NUM_TOKENS, ignore_eos=True)
ADAPTERS = {  # name -> (rank, alpha, targets, rsLoRA)
    "attn": (8, 16, ATTENTION, False),
    "mlp": (4, 8, MLP, True),
    "all": (16, 16, ATTENTION + MLP, False),
}


def hf_tokens(hf_model: torch.nn.Module, prompts: list[list[int]]) -> list[list[int]]:
    """transformers' greedy tokens, on one thread (a tiny model: threads only add barriers,
    slow on a busy host)."""
    result = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for ids in prompts:
            with torch.no_grad():
                out = hf_model.generate(
                    torch.tensor([ids]), do_sample=False, max_new_tokens=NUM_TOKENS,
                    min_new_tokens=NUM_TOKENS, eos_token_id=None, pad_token_id=0,
                )  # fmt: skip
            result.append(out[0, len(ids) :].tolist())
    finally:
        torch.set_num_threads(threads)
    return result


def request(adapters: dict[str, Path], name: str) -> LoRARequest:
    return LoRARequest(name, 0, str(adapters[name]))


def ours(llm: LLM, loras: list[LoRARequest | None]) -> list[list[int]]:
    """Our greedy tokens for PROMPTS repeated once per len(PROMPTS) entries of `loras`."""
    outputs = llm.generate(PROMPTS * (len(loras) // len(PROMPTS)), GREEDY, lora_request=loras)
    return [list(o.outputs[0].token_ids) for o in outputs]


@dataclass(frozen=True)
class QuantizedBase:
    gguf: Path
    """A Q8_0 GGUF Llama (Q/K permuted as llama.cpp stores them)."""
    adapter: Path
    """A PEFT adapter on every projection, written on transformers' dequantized copy."""
    llm: LLM
    """The GGUF served with its blocks kept quantized and float activations (transformers
    rounds no activation to int8)."""
    want: list[list[int]]
    """transformers + PEFT's greedy tokens on the dequantized copy, for PROMPTS."""
