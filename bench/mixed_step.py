"""Engine step time under issue 12's mixed load, per prefill cap, in one process (no HTTP).

    python bench/mixed_step.py [--caps 64,128,192,256,384,512] [--decoders 16] [--rounds 2]

For each cap (`max_prefill_tokens_while_decoding`, budget 512 as the server's default), 16
requests (128-token prompts) decode while one 2,200-token prompt prefills next to them: the
time of each engine.step() while it prefills (what every decoder waits between two tokens),
its first-token time (TTFT), and the time of steps with decodes only. Caps run alternating,
`--rounds` times; the table gives the median over rounds of each round's median and minimum
step (the minimum is the figure least disturbed by a shared machine).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from pagedserve import LLM, SamplingParams


def measure(llm: LLM, decoders: int, long_tokens: int, offset: int) -> dict[str, float]:
    engine = llm.engine
    words = llm.tokenizer.encode("apple river stone music garden window paper silver " * 600)
    decode = SamplingParams(temperature=0, max_tokens=1000, ignore_eos=True)
    for i in range(decoders):
        engine.add_request(f"d{i}", words[offset + i : offset + i + 128], decode)
    while engine.scheduler.num_waiting:
        engine.step()
    for _ in range(3):  # every decoder has its first token
        engine.step()
    only_decodes = []
    for _ in range(5):
        t = time.perf_counter()
        engine.step()
        only_decodes.append(time.perf_counter() - t)
    long = words[1000 + offset : 1000 + offset + long_tokens]
    engine.add_request("long", long, SamplingParams(max_tokens=1))
    steps, start, first = [], time.perf_counter(), 0.0
    while not first:
        t = time.perf_counter()
        outs = engine.step()
        steps.append(time.perf_counter() - t)
        if any(o.request_id == "long" and o.finished for o in outs):
            first = time.perf_counter() - start
    for i in range(decoders):
        engine.abort(f"d{i}")
    while engine.has_unfinished():
        engine.step()
    return {
        "step median s": statistics.median(steps),
        "step min s": min(steps),
        "step max s": max(steps),
        "steps": len(steps),
        "long TTFT s": first,
        "decode-only step s": statistics.median(only_decodes),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--caps", default="64,128,192,256,384,512")
    p.add_argument("--decoders", type=int, default=16)
    p.add_argument("--long-tokens", type=int, default=2200)
    p.add_argument("--rounds", type=int, default=2)
    opts = p.parse_args()
    caps = [int(c) for c in opts.caps.split(",")]
    load_before = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    llms = {c: LLM("", max_model_len=4096, num_pages=1024, enable_prefix_caching=False,
                   max_prefill_tokens_while_decoding=c) for c in caps}  # fmt: skip
    rounds: dict[int, list[dict[str, float]]] = {c: [] for c in caps}
    for r in range(opts.rounds):
        for cap in caps:
            rounds[cap].append(measure(llms[cap], opts.decoders, opts.long_tokens, offset=r * 7))
            print(f"round {r + 1} cap {cap}: {rounds[cap][-1]}", file=sys.stderr, flush=True)
    cpu = next(
        (line.partition(":")[2].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
         if line.startswith("model name")), "?",
    )  # fmt: skip
    load_after = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    columns = list(rounds[caps[0]][0])
    print(f"CPU {cpu}, {os.cpu_count()} cores, load average {load_before} before, {load_after} "
          f"after; {opts.decoders} decoders + one {opts.long_tokens}-token prompt, budget 512, "
          f"medians of {opts.rounds} alternating rounds\n")  # fmt: skip
    print("| cap | " + " | ".join(columns) + " |\n|---:|" + "---:|" * len(columns))
    for cap in caps:
        cells = [f"{statistics.median(x[c] for x in rounds[cap]):.3g}" for c in columns]
        print(f"| {cap} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
