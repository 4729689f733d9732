"""The default model's precision choices side by side: speed and agreement with the fp32 oracle.

    python -m bench.engine.default_precision [--repeats 3] [--configs bfloat16/int8,float32/int16]

Each config is DTYPE/ACTIVATIONS[/KV]: --dtype, --quantized-activations and, optionally,
--kv-cache-dtype, on the default model (SmolLM2-135M-Instruct Q4_1) kept quantized. Offline
through LLM.generate, the engines interleaved within each repeat (medians):
- c1: one request, 128 greedy tokens after a short prompt, output tokens/s;
- c32: 32 prompts x 128 tokens at once, output tokens/s;
- prefill 1k: one ~1,000-token prompt, 1 token out, seconds.
Then agreement with transformers in fp32 on the dequantized weights (the oracle, same GGUF):
4 raw prompts and 4 chat prompts x 48 greedy tokens, each one's first position where the token
ids differ and the oracle's top-2 logit gap there (a gap near 0 is a near-tie), and the answer
to "What is the capital of France?". Prints the CPU model and the load average: compare within
one run only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass

import torch

from bench.engine.quantized import tokens_per_s
from pagedserve.core.engine.llm import LLM
from pagedserve.core.models.resolve import DEFAULT_CACHE_DIR, fetch_default_model
from pagedserve.core.ops.cpu_features import cpu_model
from pagedserve.core.sampling_params import SamplingParams

RAW = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea,",
    "List three colors:\n1.",
]
CHATS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "How do I reverse a list in Python?",
    "Give me three tips for sleeping better.",
]
AGREEMENT_TOKENS = 48


@dataclass
class Oracle:
    prompts: list[list[int]]
    tokens: list[list[int]]
    gaps: list[list[float]]  # the top-2 logit gap at each greedy position


def oracle(llm: LLM) -> Oracle:
    """transformers' fp32 greedy tokens on the same GGUF (dequantized by gguf)."""
    from transformers import AutoModelForCausalLM

    gguf = fetch_default_model(DEFAULT_CACHE_DIR.expanduser())
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    ).eval()
    template = llm.engine.chat_template
    assert template is not None
    chat = [
        llm.tokenizer.encode(
            template.render([{"role": "user", "content": c}], add_generation_prompt=True),
            add_special_tokens=False,
        )
        for c in CHATS
    ]
    prompts = [llm.tokenizer.encode(p) for p in RAW] + chat
    result = Oracle(prompts, [], [])
    for ids in prompts:
        # The chat prompts hold <|im_end|>, which is also the pad token: without an explicit
        # mask generate() would mask those positions out.
        with torch.no_grad():
            out = model.generate(
                torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                do_sample=False, max_new_tokens=AGREEMENT_TOKENS, min_new_tokens=AGREEMENT_TOKENS,
                eos_token_id=None, output_scores=True, return_dict_in_generate=True,
            )  # fmt: skip
        result.tokens.append(out.sequences[0, len(ids) :].tolist())
        top2 = [s[0].topk(2).values for s in out.scores]
        result.gaps.append([float(v[0] - v[1]) for v in top2])
    return result


def prefill_s(llm: LLM, prompt: list[int]) -> float:
    start = time.perf_counter()
    llm.generate([prompt], SamplingParams(temperature=0, max_tokens=1))
    return time.perf_counter() - start


def make(config: str) -> LLM:
    dtype, activations, *kv = config.split("/")
    return LLM(
        dtype=dtype, quantization="auto", quantized_activations=activations,
        kv_cache_dtype=kv[0] if kv else "auto", enable_prefix_caching=False, max_num_seqs=64,
        num_pages=1024,
    )  # fmt: skip


def agreement(llm: LLM, truth: Oracle) -> str:
    params = SamplingParams(temperature=0, max_tokens=AGREEMENT_TOKENS, ignore_eos=True)
    outs = llm.generate(truth.prompts, params)
    parted = []
    for i, (out, want, gaps) in enumerate(zip(outs, truth.tokens, truth.gaps, strict=True)):
        got = out.outputs[0].token_ids
        at = next((j for j, (a, b) in enumerate(zip(got, want, strict=True)) if a != b), None)
        if at is not None:
            parted.append(f"#{i} at {at} (gap {gaps[at]:.3f})")
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    answer = llm.chat(chat, SamplingParams(temperature=0, max_tokens=10)).outputs[0].text
    return f"{len(parted)}/{len(outs)} part: {', '.join(parted) or '-'}; answer {answer!r}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--configs", default="bfloat16/int8,float32/int8,bfloat16/int16,float32/int16")
    ap.add_argument("--no-speed", action="store_true", help="agreement only")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"CPU: {cpu_model()}; threads {args.threads}; load average {os.getloadavg()}")
    llms = {c: make(c) for c in args.configs.split(",")}
    first = next(iter(llms.values()))
    short = first.tokenizer.encode("Tell me a story about a robot.")
    batch = [first.tokenizer.encode(f"Story {i}: once upon a time") for i in range(32)]
    words = " ".join(
        f"The {i}th entry of the log says the engine kept its pages." for i in range(90)
    )
    long = first.tokenizer.encode(words)[:1000]
    figures: dict[str, dict[str, list[float]]] = {
        c: {"c1": [], "c32": [], "prefill": []} for c in llms
    }
    for _ in range(0 if args.no_speed else args.repeats):
        for c, llm in llms.items():
            figures[c]["c1"].append(tokens_per_s(llm, [short], 128))
            figures[c]["c32"].append(tokens_per_s(llm, batch, 128))
            figures[c]["prefill"].append(prefill_s(llm, long))
    print(f"load average after timing {os.getloadavg()}")
    truth = oracle(first)
    base = next(iter(llms))
    print(
        "| config | c1 tok/s | c32 tok/s | prefill 1k s | c1 vs first | c32 vs first | agreement |"
    )
    print("|---|---:|---:|---:|---:|---:|---|")
    for c, llm in llms.items():
        med = {k: statistics.median(v) if v else float("nan") for k, v in figures[c].items()}
        ratio = {k: med[k] / statistics.median(figures[base][k]) if figures[base][k] else 0.0
                 for k in med}  # fmt: skip
        print(f"| {c} | {med['c1']:.1f} | {med['c32']:.1f} | {med['prefill']:.3f} | "
              f"{ratio['c1']:.2f}x | {ratio['c32']:.2f}x | {agreement(llm, truth)} |")  # fmt: skip


if __name__ == "__main__":
    main()
