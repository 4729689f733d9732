"""The quantized linear kernel of two source trees side by side, at one ISA level.

    python -m bench.kernels.linear_quant_ab BASE_TREE CANDIDATE_TREE [--isa avx2] [--types Q4_1,Q8_0]
        [--rows 32,1024] [--threads 1] [--rounds 3]

Each tree (a source checkout with its own `_core` build beside its sources or under its build/, as
bench/engine/determinism_cost.py describes, or the editable install's tree: `.`) runs in a fresh
process (bench/common/in_tree.py), the two alternating for --rounds rounds, at SmolLM2-135M's layer
shapes (qkv, o + residual, gate_up with its SiLU-gated epilogue, down + residual; bf16 in and
out), the same weights (gguf's quantizer, seed 0) and inputs in both. Each process prints, per type, layer
and row count, the median of its calls in us; the table is the median over rounds of each, the
ratio candidate / base and the candidate's GFLOP/s. The CPU model and load average are printed:
on a shared machine read the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

from bench.common import tree_json

LAYERS = [("qkv", 576, 960, False, 0), ("o+res", 576, 576, True, 0),
          ("gate_up", 576, 3072, False, 1536), ("down+res", 1536, 576, True, 0)]  # fmt: skip


def worker(argv: list[str]) -> int:
    """One tree's process (bench.common.in_tree loaded its pagedserve): ISA, types, rows, threads."""
    import time

    import numpy as np
    import torch
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    from pagedserve.core.ops.cpu_features import set_cpu_isa
    from pagedserve.core.ops.linear_quant import pack_quant_weight, quant_linear, quant_linear_path

    isa, types, rows, threads = argv[0], argv[1].split(","), argv[2], int(argv[3])
    torch.set_num_threads(threads)
    set_cpu_isa(isa)
    res: dict = {"path": quant_linear_path()}
    for t in types:
        qtype = GGMLQuantizationType[t]
        for name, k, n, residual, gated in LAYERS:
            rng = np.random.default_rng(0)
            blocks = np.ascontiguousarray(quantize(rng.standard_normal((n, k), np.float32), qtype))
            addresses = blocks.ctypes.data + np.arange(n, dtype=np.int64) * blocks.strides[0]
            packed = pack_quant_weight(int(qtype), addresses, k)
            for m in map(int, rows.split(",")):
                g = torch.Generator().manual_seed(m)
                x = torch.randn(m, k, generator=g).bfloat16()
                r = torch.randn(m, n, generator=g).bfloat16() if residual else None
                out = torch.empty(m, gated or n, dtype=torch.bfloat16)
                calls = max(3, min(200, int(3e8 // (m * n * k))))
                times = []
                for _ in range(calls):
                    s = time.perf_counter()
                    quant_linear(out, x, packed, int(qtype), None, r, gated)
                    times.append(time.perf_counter() - s)
                res[f"{t} {name} {m}"] = [statistics.median(times) * 1e6, 2 * m * n * k]
    print(json.dumps(res))
    return 0


def cpu_model() -> str:
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown CPU"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("base")
    ap.add_argument("candidate")
    ap.add_argument("--isa", default="avx2")
    ap.add_argument("--types", default="Q4_1,Q8_0")
    ap.add_argument("--rows", default="32,1024")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    print(f"CPU: {cpu_model()}; isa {args.isa}; threads {args.threads}; "
          f"load before {os.getloadavg()}")  # fmt: skip
    runs: dict[str, list[dict]] = {args.base: [], args.candidate: []}
    for _ in range(args.rounds):
        for tree in (args.base, args.candidate):
            runs[tree].append(tree_json(tree, "bench.kernels.linear_quant_ab:worker", args.isa,
                                        args.types, args.rows, str(args.threads)))  # fmt: skip
    base, cand = runs[args.base], runs[args.candidate]
    print(f"paths: base {base[0]['path']}, candidate {cand[0]['path']}")
    print("| case | base us | candidate us | candidate / base | candidate GFLOP/s |")
    print("|---|---:|---:|---:|---:|")
    for key in (k for k in base[0] if k != "path"):
        b = statistics.median(r[key][0] for r in base)
        c = statistics.median(r[key][0] for r in cand)
        print(f"| {key} | {b:.0f} | {c:.0f} | {c / b:.3f} | {cand[0][key][1] / c / 1e3:.0f} |")
    print(f"load after {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
