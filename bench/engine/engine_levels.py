"""The offline engine at several ISA levels side by side, one tree (issue 24's per-level figures).

    python -m bench.engine.engine_levels [--levels avx2,avx512,avx512_bf16] [--quantization none]
                                  [--dtype bfloat16] [--rounds 3]

Each level runs in a fresh process, the levels in turn for --rounds rounds:
`LLM(cpu_isa=level, quantization=..., dtype=..., enable_prefix_caching=False)` on the default
model, 2 threads, then twice one 32-token prompt decoding 128 greedy tokens (c1 output tok/s)
and 16 x 128-token prompts x 128 tokens at once (c16 output tok/s); each process prints its
medians. With the default --quantization none the linears are the dense bf16 kernels (every step
native: --deterministic). The CPU model and load average are printed: on a shared machine read
the rounds side by side.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

WORKER = """
import json, logging, statistics, sys, time
isa, quantization, dtype = sys.argv[1:4]
logging.disable(logging.WARNING)
from pagedserve import LLM, SamplingParams
llm = LLM(cpu_isa=isa, quantization=quantization, dtype=dtype, enable_prefix_caching=False)
ids = llm.tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 40)
out = SamplingParams(temperature=0, max_tokens=128, ignore_eos=True)
llm.generate([ids[:32]], out)  # warm-up
res = {"c1 tok/s": [], "c16 tok/s": []}
for _ in range(2):
    t = time.perf_counter()
    llm.generate([ids[:32]], out)
    res["c1 tok/s"].append(128 / (time.perf_counter() - t))
    t = time.perf_counter()
    llm.generate([ids[i:i + 128] for i in range(16)], out)
    res["c16 tok/s"].append(16 * 128 / (time.perf_counter() - t))
print(json.dumps({k: round(statistics.median(v), 1) for k, v in res.items()}))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--levels", default="avx2,avx512,avx512_bf16")
    ap.add_argument("--quantization", default="none")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    from pagedserve.core.ops.cpu_features import cpu_model

    print(f"CPU: {cpu_model()}; quantization {a.quantization}, dtype {a.dtype}; "
          f"load average before {os.getloadavg()}")  # fmt: skip
    for _ in range(a.rounds):
        for level in a.levels.split(","):
            cmd = [sys.executable, "-c", WORKER, level, a.quantization, a.dtype]
            run = subprocess.run(cmd, capture_output=True, text=True)
            print(level, run.stdout.strip() or run.stderr[-800:], flush=True)
    print(f"load average after {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
