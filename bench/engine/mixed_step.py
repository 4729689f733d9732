"""Engine step time under issue 12's mixed load, per prefill cap, in one process (no HTTP).

    python -m bench.engine.mixed_step [--caps 512,320,256,192] [--decoders 16] [--rounds 3]

One engine per cap (`max_prefill_tokens_while_decoding`; budget 512 as the server's default, so
cap 512 is no cap): 16 requests (128-token prompts) decode while a 2,200-token prompt prefills
next to them, `--rounds` prompts one after the other. The engines take their steps in turn,
one step each, so a shared machine's load falls on every cap alike. Per cap: the time of the
steps while a long prompt prefills (what every decoder waits between two tokens: median, p90,
max), those steps' count per prompt, the prompt's time to first token in engine time (the sum
of its steps), and the time of a step with decodes only. Then, unless --no-throughput, the plain
c=32 load offline: 64 requests (128-token prompts, 128 out, max_num_seqs 32) per cap, caps
alternating, `--rounds` times: output tokens/s (median).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from pagedserve import LLM, SamplingParams
from pagedserve.core.ops.cpu_features import cpu_model

Sample = tuple[str, float]  # (phase, seconds of one engine.step())


def run(llm: LLM, decoders: int, long_tokens: int, rounds: int) -> Iterator[Sample]:
    """Steps one engine through the load, yielding after each step."""
    engine = llm.engine
    words = llm.tokenizer.encode("apple river stone music garden window paper silver " * 700)
    decode = SamplingParams(temperature=0, max_tokens=2000, ignore_eos=True)
    for i in range(decoders):
        engine.add_request(f"d{i}", words[i : i + 128], decode)
    for _ in range(8):  # the decoders' prompts (4 steps at 512), then decodes only
        engine.step()
        yield "setup", 0.0
    for r in range(rounds):
        for _ in range(3):
            t = time.perf_counter()
            engine.step()
            yield "decode", time.perf_counter() - t
        prompt = words[1000 + 11 * r : 1000 + 11 * r + long_tokens]
        engine.add_request(f"long{r}", prompt, SamplingParams(max_tokens=1))
        finished = False
        while not finished:
            t = time.perf_counter()
            outs = engine.step()
            yield "prefill", time.perf_counter() - t
            finished = any(o.request_id == f"long{r}" and o.finished for o in outs)
        yield "ttft", 0.0  # marks the end of one long prompt
    for i in range(decoders):
        engine.abort(f"d{i}")


def summarize(samples: list[Sample], rounds: int) -> dict[str, float]:
    prefill = sorted(s for phase, s in samples if phase == "prefill")
    ttfts, current = [], 0.0
    for phase, seconds in samples:
        if phase == "prefill":
            current += seconds
        elif phase == "ttft":
            ttfts.append(current)
            current = 0.0
    return {
        "step p50 s": statistics.median(prefill),
        "step p90 s": prefill[int(0.9 * (len(prefill) - 1))],
        "step max s": prefill[-1],
        "steps per prompt": len(prefill) / rounds,
        "TTFT p50 s": statistics.median(ttfts),
        "decode-only step s": statistics.median(s for p, s in samples if p == "decode"),
    }


def throughput(llm: LLM, round_: int) -> float:
    words = llm.tokenizer.encode("river stone music garden window paper silver apple " * 400)
    prompts = [words[round_ * 97 + 13 * i : round_ * 97 + 13 * i + 128] for i in range(64)]
    params = SamplingParams(temperature=0, max_tokens=128, ignore_eos=True)
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    return sum(len(o.outputs[0].token_ids) for o in outs) / (time.perf_counter() - start)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--caps", default="512,320,256,192")
    p.add_argument("--decoders", type=int, default=16)
    p.add_argument("--long-tokens", type=int, default=2200)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--no-throughput", action="store_true")
    opts = p.parse_args()
    caps = [int(c) for c in opts.caps.split(",")]
    llms = {c: LLM("", max_model_len=4096, num_pages=640, enable_prefix_caching=False,
                   max_num_seqs=32, max_prefill_tokens_while_decoding=c) for c in caps}  # fmt: skip
    load_before = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    runs = {c: run(llms[c], opts.decoders, opts.long_tokens, opts.rounds) for c in caps}
    samples: dict[int, list[Sample]] = {c: [] for c in caps}
    while runs:  # one step of each engine in turn
        for cap in list(runs):
            try:
                samples[cap].append(next(runs[cap]))
            except StopIteration:
                del runs[cap]
    results = {c: summarize(samples[c], opts.rounds) for c in caps}
    rates: dict[int, list[float]] = {c: [] for c in caps}
    for r in range(0 if opts.no_throughput else opts.rounds):
        for cap in caps:
            rates[cap].append(throughput(llms[cap], r))
    for cap in caps:
        if rates[cap]:
            results[cap]["c32 tok/s"] = statistics.median(rates[cap])
    load_after = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    print(f"CPU {cpu_model()}, {os.cpu_count()} cores, {torch.get_num_threads()} threads, "
          f"load average {load_before} before, "
          f"{load_after} after; {opts.decoders} decoders + {opts.rounds} prompts of "
          f"{opts.long_tokens} tokens one after the other, budget 512, engines stepping in turn\n")  # fmt: skip
    columns = list(results[caps[0]])
    print("| cap | " + " | ".join(columns) + " |\n|---:|" + "---:|" * len(columns))
    for cap in caps:
        print(f"| {cap} | " + " | ".join(f"{results[cap][c]:.3g}" for c in columns) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
