"""Long-context decode with the KV cache in the model's dtype (bf16), in int8 and in fp8 e4m3
(issue 41), in one process (no HTTP).

    python -m bench.engine.kv_cache_dtype [--contexts 4096,8000] [--concurrency 1,8] [--steps 24]
                                          [--rounds 3] [--budget-gib 2]

One engine per KV dtype: the default model (SmolLM2-135M Q4_1 GGUF), bf16 activations,
`--kv-cache-dtype auto`, `int8` and `fp8_e4m3`, the same number of pages. First the pages each dtype fits in
a --budget-gib KV budget (the start-up line's count). Then per (context, c): c requests whose
prompts are the first `context` tokens of one text (the first prefills it, the other c - 1 take
its full pages from the prefix cache and prefill their last page: every request reads its whole
context each decode step), stepped until every request has its first token; then the engines
take --rounds turns of --steps decode steps each, so a shared machine's load falls on all
alike. Prints the CPU model, and per (context, c) each dtype's median decode tok/s (c tokens per
step) and the 8-bit ones' ratios to bf16.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

from pagedserve import LLM, SamplingParams
from pagedserve.core.ops.cpu_features import cpu_model
from pagedserve.core.runner.model_runner import ModelRunner
from pagedserve.core.sched.kv_cache import GiB, size_kv_cache

DTYPES = ("auto", "int8", "fp8_e4m3")
STORED = {"auto": torch.bfloat16, "int8": torch.int8, "fp8_e4m3": torch.float8_e4m3fn}


def pages_at_budget(llm: LLM, budget_gib: float) -> dict[str, int]:
    """Pages of each KV dtype a budget holds (as the engine would size them)."""
    arch, page_size = llm.engine.model_runner.arch, llm.engine.model_info.page_size
    out = {}
    for name, dtype in STORED.items():
        spec = ModelRunner.kv_spec(arch, page_size, dtype)
        out[name] = size_kv_cache(spec, 1, int(budget_gib * GiB)).num_pages
    return out


def prefill(llm: LLM, prompt: list[int], c: int, max_tokens: int) -> list[str]:
    """c requests on the prompt (each its own last token), stepped until each has a token: the
    first alone, so that the others find its full pages in the prefix cache."""
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    ids = [f"r{i}" for i in range(c)]
    started: set[str] = set()
    for group in (ids[:1], ids[1:]):
        for rid in group:
            engine.add_request(rid, [*prompt[:-1], prompt[-1] + int(rid[1:])], params)
        while not started.issuperset(group):
            for out in engine.step():
                if out.outputs and out.outputs[0].token_ids:
                    started.add(out.request_id)
    return ids


def decode_rate(llm: LLM, c: int, steps: int) -> float:
    t = time.perf_counter()
    for _ in range(steps):
        llm.engine.step()
    return c * steps / (time.perf_counter() - t)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--contexts", default="4096,8000")
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--budget-gib", type=float, default=2.0)
    args = ap.parse_args()
    contexts = [int(x) for x in args.contexts.split(",")]
    levels = [int(x) for x in args.concurrency.split(",")]
    decode_tokens = args.steps * args.rounds + 8
    max_len = max(contexts) + decode_tokens
    num_pages = max(levels) * (-(-max_len // 16) + 1) + 16
    llms = {
        kv: LLM(dtype="bfloat16", kv_cache_dtype=kv, num_pages=num_pages, max_model_len=max_len)
        for kv in DTYPES
    }
    print(f"CPU {cpu_model()}, {os.cpu_count()} cores, {torch.get_num_threads()} threads, "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)  # fmt: skip
    pages = pages_at_budget(llms["auto"], args.budget_gib)
    print(f"KV pages in {args.budget_gib:g} GiB: bf16 {pages['auto']}, "
          + ", ".join(f"{kv} {pages[kv]} ({pages[kv] / pages['auto']:.2f}x)" for kv in DTYPES[1:]),
          flush=True)  # fmt: skip
    words = llms["auto"].tokenizer.encode(
        "The river carried silver stones past the old mill, and the miller counted them. " * 900
    )
    for ctx in contexts:
        prompt = words[:ctx]
        for c in levels:
            rates: dict[str, list[float]] = {kv: [] for kv in DTYPES}
            ids = {}
            for kv, llm in llms.items():
                t = time.perf_counter()
                ids[kv] = prefill(llm, prompt, c, decode_tokens)
                print(f"  {kv}: prefill {ctx} x {c} in {time.perf_counter() - t:.1f} s", flush=True)
            for _ in range(args.rounds):
                for kv, llm in llms.items():
                    rates[kv].append(decode_rate(llm, c, args.steps))
            for kv, llm in llms.items():
                for rid in ids[kv]:
                    llm.engine.abort(rid)
                while llm.engine.has_unfinished():
                    llm.engine.step()
            median = {kv: statistics.median(rates[kv]) for kv in DTYPES}
            print(f"context {ctx} c={c}: bf16 KV {median['auto']:.1f} tok/s, "
                  + ", ".join(f"{kv} KV {median[kv]:.1f} ({median[kv] / median['auto']:.2f}x)"
                              for kv in DTYPES[1:])
                  + f" (rounds: {rates})", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
