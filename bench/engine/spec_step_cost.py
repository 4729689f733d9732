"""What a verification chunk costs the target (issue 26): the time of one engine step of B
decoding sequences on the default model, each with D draft tokens (random drafts, so all are
rejected and rolled back: the step repeats itself), for B in --batches and D in --drafts.
Prints one JSON object: median step ms per (B, D), and each D's time over D = 0's.

    flock /tmp/pagedserve-bench.lock python -m bench.engine.spec_step_cost --batches 1 4 8 16 32
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from pagedserve import LLM, SamplingParams
from pagedserve.core.engine.llm_engine import LLMEngine


def step_ms(engine: LLMEngine, seq_ids: list[int], num_draft: int, steps: int) -> float:
    rng = random.Random(0)
    times = []
    for _ in range(steps):
        for seq_id in seq_ids:
            engine.scheduler.propose(seq_id, [rng.randrange(1000, 2000) for _ in range(num_draft)])
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def measure(batch: int, drafts: list[int], steps: int, rounds: int) -> dict[int, float]:
    llm = LLM("", num_pages=4096, max_num_seqs=64, max_num_batched_tokens=2048)
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=4000, ignore_eos=True)
    for i in range(batch):
        engine.add_request(str(i), [1 + (i * 7 + j) % 500 for j in range(64)], params)
    for _ in range(3):  # prompts, then warm decode steps
        engine.step()
    seq_ids = list(engine.output_processor.seqs)
    results: dict[int, list[float]] = {d: [] for d in drafts}
    for _ in range(rounds):  # interleaved: a drift in the machine's load hits every D alike
        for d in drafts:
            results[d].append(step_ms(engine, seq_ids, d, steps))
    return {d: round(statistics.median(v), 2) for d, v in results.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 4, 8, 16, 32])
    p.add_argument("--drafts", type=int, nargs="+", default=[0, 1, 2, 4])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    report = {}
    for batch in args.batches:
        ms = measure(batch, args.drafts, args.steps, args.rounds)
        base = ms[args.drafts[0]]
        report[batch] = {"step_ms": ms, "ratio": {d: round(t / base, 3) for d, t in ms.items()}}
        print(json.dumps({batch: report[batch]}), flush=True)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
