"""Microbenchmark of the batched sampler: one step of N rows over a vocabulary of V tokens.

    python -m bench.kernels.sampler [--rows 64] [--vocab 49152] [--threads 2] [--steps 50]

Prints the median and best milliseconds per step for a few batch mixes. The machine is shared,
so the best time is the steadier figure.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from pagedserve.core.sampling.sampler import Sampler, SamplingBatch, SamplingRow
from pagedserve.core.sampling_params import SamplingParams

MIXES: dict[str, Callable[[int], SamplingParams]] = {
    "greedy": lambda i: SamplingParams(temperature=0),
    "temperature": lambda i: SamplingParams(temperature=0.8),
    "top_p 0.9": lambda i: SamplingParams(temperature=0.8, top_p=0.9),
    "top_k 40": lambda i: SamplingParams(temperature=0.8, top_k=40),
    "mixed": lambda i: [
        SamplingParams(temperature=0),
        SamplingParams(temperature=0.7, top_p=0.95, seed=i),
        SamplingParams(temperature=1.0, top_k=50, presence_penalty=0.5),
        SamplingParams(temperature=0.8, min_p=0.05, frequency_penalty=0.3, logprobs=5),
    ][i % 4],
}


def bench(mix: str, rows: int, vocab: int, steps: int) -> tuple[float, float]:
    sampler = Sampler()
    batch_rows = [
        SamplingRow(
            params := MIXES[mix](i),
            prompt_token_ids=torch.randint(0, vocab, (200,)).tolist(),
            output_token_ids=torch.randint(0, vocab, (100,)).tolist(),
            generator=None if params.seed is None else torch.Generator().manual_seed(params.seed),
        )
        for i in range(rows)
    ]
    # Model-like logits: a few likely tokens over a long tail.
    logits = torch.randn(rows, vocab) * 3
    times = []
    for _ in range(steps):
        step_logits = logits.clone()
        start = time.perf_counter()
        batch = SamplingBatch.build(
            batch_rows, vocab_size=vocab, eos_token_ids=frozenset({0}), device=torch.device("cpu")
        )
        sampler(step_logits, batch)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3, min(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{args.rows} rows x vocab {args.vocab}, {args.threads} threads (build + sample)")
    for mix in MIXES:
        median, best = bench(mix, args.rows, args.vocab, args.steps)
        print(f"  {mix:12s} median {median:7.2f} ms   best {best:7.2f} ms")


if __name__ == "__main__":
    main()
