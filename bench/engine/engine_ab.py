"""The offline engine of two source trees side by side, at one ISA level (issue 24's A/Bs).

    python -m bench.engine.engine_ab BASE_TREE CANDIDATE_TREE [--isa avx2] [--pairs 2] [--reps 2]
        [--base-args JSON] [--candidate-args JSON]

Each tree (a source checkout with its own `_core` build beside its sources or under its build/, as
bench/engine/determinism_cost.py describes, or the editable install's tree: `.`) runs in a fresh
process (bench/common/in_tree.py: either module layout, before or after issue 37's regrouping),
the two alternating for --pairs pairs: `LLM(cpu_isa=..., enable_prefix_caching=False)` on the
default model, 2 threads, then --reps
times a 1,000-token prompt with max_tokens=1 (seconds), one 128-token prompt x 128 greedy tokens
(c=1 output tok/s) and 32 x 128-token prompts x 128 greedy tokens at once (c=32 output tok/s);
each process prints its medians. --base-args / --candidate-args add LLM() keyword arguments to
one side (a JSON object: `'{"quantized_activations": "int8", "dtype": "bfloat16"}'` runs a
newer tree with an older default). The CPU model and load average
are printed: on a shared machine read the pairs side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from bench.common import tree_json


def worker(argv: list[str]) -> int:
    """One tree's process (bench.common.in_tree loaded its pagedserve): ISA, repeats."""
    import logging
    import statistics
    import time

    isa, reps, extra = argv[0], int(argv[1]), json.loads(argv[2] if len(argv) > 2 else "{}")
    logging.disable(logging.WARNING)
    from pagedserve import LLM, SamplingParams

    # A tree from before the ISA levels (no cpu_isa argument) runs at its one path: pass it only
    # if forced.
    llm = LLM(**({} if isa == "auto" else {"cpu_isa": isa}), enable_prefix_caching=False, **extra)
    text = "The quick brown fox jumps over the lazy dog while the sun sets slowly. " * 200
    ids = llm.tokenizer.encode(text)
    one = SamplingParams(temperature=0, max_tokens=1)
    many = SamplingParams(temperature=0, max_tokens=128, ignore_eos=True)
    llm.generate([ids[:1000]], one)  # warm-up
    res: dict[str, list[float]] = {"1k prefill s": [], "c1 tok/s": [], "c32 tok/s": []}
    for _ in range(reps):
        t = time.perf_counter()
        llm.generate([ids[:1000]], one)
        res["1k prefill s"].append(time.perf_counter() - t)
        t = time.perf_counter()
        out = llm.generate([ids[:128]], many)
        res["c1 tok/s"].append(len(out[0].outputs[0].token_ids) / (time.perf_counter() - t))
        t = time.perf_counter()
        out = llm.generate([ids[i : i + 128] for i in range(32)], many)
        tokens = sum(len(o.outputs[0].token_ids) for o in out)
        res["c32 tok/s"].append(tokens / (time.perf_counter() - t))
    print(json.dumps({k: round(statistics.median(v), 3) for k, v in res.items()}))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("base")
    ap.add_argument("candidate")
    ap.add_argument("--isa", default="auto")
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--base-args", default="{}", help="LLM() keyword arguments (JSON) of the base")
    ap.add_argument("--candidate-args", default="{}", help="... of the candidate")
    a = ap.parse_args()
    from pagedserve.core.ops.cpu_features import cpu_model

    print(f"CPU: {cpu_model()}; isa {a.isa}; load average before {os.getloadavg()}")
    sides = ((a.base, a.base_args), (a.candidate, a.candidate_args))
    print("; ".join(f"{tree} {args}" for tree, args in sides))
    for _ in range(a.pairs):
        for tree, args in sides:
            result = tree_json(tree, "bench.engine.engine_ab:worker", a.isa, str(a.reps), args)
            print(tree, result, flush=True)
    print(f"load average after {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
