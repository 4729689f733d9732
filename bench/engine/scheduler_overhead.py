"""Scheduler overhead per engine step: schedule() + update() through the Python wrapper.

Steady-state decode of `--num-seqs` running requests whose contexts are 1-2k tokens long (the
model is not run; sampled tokens are constants). Prints one JSON line: the median and p90 of
schedule()+update() in microseconds over `--repeats` steps.

    python -m bench.engine.scheduler_overhead --num-seqs 256 --page-size 16
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from pagedserve.core.sched.scheduler import Scheduler


def build(num_seqs: int, page_size: int, min_len: int, max_len: int, steps: int) -> Scheduler:
    # Room for the decode tokens of early requests while the later ones still prefill.
    max_tokens = steps + (num_seqs * max_len) // 2048 + 32
    max_model_len = max_len + max_tokens
    pages_per_seq = (max_model_len + page_size - 1) // page_size
    scheduler = Scheduler(
        num_pages=num_seqs * pages_per_seq + 16,
        page_size=page_size,
        max_num_seqs=num_seqs,
        max_num_batched_tokens=max(2048, num_seqs),
        max_model_len=max_model_len,
        enable_prefix_caching=True,
    )
    rng = np.random.default_rng(0)
    for seq_id in range(num_seqs):
        prompt = rng.integers(0, 32000, size=int(rng.integers(min_len, max_len + 1)))
        scheduler.add_request(seq_id, prompt.astype(np.int32), max_tokens=max_tokens)
    return scheduler


def prefill(scheduler: Scheduler) -> None:
    """Step until every request is decoding (one token per step)."""
    while True:
        plan = scheduler.schedule()
        scheduler.update(plan, np.ones(len(plan.logits_indices), dtype=np.int32))
        if scheduler.num_waiting == 0 and plan.max_query_len == 1:
            return


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-seqs", type=int, default=256)
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--min-len", type=int, default=1024)
    parser.add_argument("--max-len", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=500)
    args = parser.parse_args()

    scheduler = build(args.num_seqs, args.page_size, args.min_len, args.max_len, args.repeats)
    prefill(scheduler)
    sampled = np.ones(args.num_seqs, dtype=np.int32)
    times_us = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        plan = scheduler.schedule()
        scheduler.update(plan, sampled)
        times_us.append((time.perf_counter() - start) * 1e6)
        assert plan.num_reqs == args.num_seqs and plan.num_tokens == args.num_seqs
    times_us.sort()
    print(
        json.dumps(
            {
                "bench": "scheduler_overhead",
                "num_seqs": args.num_seqs,
                "page_size": args.page_size,
                "context_len": [args.min_len, args.max_len],
                "repeats": args.repeats,
                "median_us": round(statistics.median(times_us), 1),
                "p90_us": round(times_us[int(0.9 * len(times_us))], 1),
            }
        )
    )


if __name__ == "__main__":
    main()
