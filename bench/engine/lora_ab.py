"""Multi-LoRA offline, two source trees side by side (issue 39's c=32 figure without HTTP): the
cost of adapter rows in a step, and what a change to the LoRA kernel or the decoder stack buys.

    python -m bench.engine.lora_ab BASE_TREE CANDIDATE_TREE [--pairs 3] [--reps 3]
        [--max-lora-rank 16] [--rank 8] [--threads 2]

Each tree (a source checkout with its own `_core` build, or `.` for the editable install; see
bench/common/in_tree.py) runs in a fresh process, the two alternating for --pairs pairs:
`LLM(enable_lora=True, max_loras=4, max_lora_rank=...)` on the default model with 4 random
rank-`rank` PEFT adapters on all 7 projections (bench/serving/lora_mix.py writes them), then
--reps times, alternating, 32 prompts x 64 greedy tokens spread over the 4 adapters and the base
(every fifth request on the base) and the same 32 on the base alone. Each process prints its
medians (seconds per wave, output tok/s) and mixed / base. The CPU model and load average are
printed: on a shared machine read the pairs side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from bench.common import tree_json


def worker(argv: list[str]) -> int:
    """One tree's process (bench.common.in_tree loaded its pagedserve): reps, ranks, threads."""
    import logging
    import statistics
    import tempfile
    import time
    from pathlib import Path

    import torch

    from bench.serving.lora_mix import ADAPTERS, write_adapter

    reps, max_rank, rank, threads = (int(v) for v in argv)
    torch.set_num_threads(threads)
    logging.disable(logging.WARNING)
    from pagedserve import LLM, SamplingParams
    from pagedserve.core.lora_request import LoRARequest

    root = Path(tempfile.mkdtemp())
    loras = [LoRARequest(name, 0, str(write_adapter(root / name, rank, i + 1)))
             for i, name in enumerate(ADAPTERS)]  # fmt: skip
    llm = LLM(enable_lora=True, max_loras=len(loras), max_lora_rank=max_rank)
    words = ["cat", "dog", "fox", "owl"]
    prompts = [f"Write a short story about a {words[i % 4]} and the sea, number {i}."
               for i in range(32)]  # fmt: skip
    params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    waves = {"mixed": [None if i % 5 == 0 else loras[i % 5 - 1] for i in range(32)],
             "base": [None] * 32}  # fmt: skip
    for lora in waves.values():  # warm-up
        llm.generate(prompts, params, lora_request=lora)
    seconds: dict[str, list[float]] = {name: [] for name in waves}
    for i in range(reps):
        for name in list(waves)[:: 1 if i % 2 == 0 else -1]:
            start = time.perf_counter()
            llm.generate(prompts, params, lora_request=waves[name])
            seconds[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(v) for name, v in seconds.items()}
    tokens = 32 * 64
    print(json.dumps({"mixed tok/s": round(tokens / medians["mixed"], 1),
                      "base tok/s": round(tokens / medians["base"], 1),
                      "mixed / base": round(medians["base"] / medians["mixed"], 3)}))  # fmt: skip
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("base")
    ap.add_argument("candidate")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--max-lora-rank", type=int, default=16)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    from pagedserve.core.ops.cpu_features import cpu_model

    print(f"CPU: {cpu_model()}; {a.threads} threads; 4 adapters of rank {a.rank} under "
          f"--max-lora-rank {a.max_lora_rank}; load average before {os.getloadavg()}")  # fmt: skip
    args = (str(a.reps), str(a.max_lora_rank), str(a.rank), str(a.threads))
    for _ in range(a.pairs):
        for tree in (a.base, a.candidate):
            print(tree, tree_json(tree, "bench.engine.lora_ab:worker", *args), flush=True)
    print(f"load average after {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
