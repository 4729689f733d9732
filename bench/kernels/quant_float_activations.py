"""The quantized linear kernel's activation paths side by side (issue 42 item 5): int8
activations, int16 activations (two int8 parts on the same kernels) and float activations (x kept
in fp32, weights dequantized in registers).

    python -m bench.kernels.quant_float_activations [--type Q4_1] [--rows 1,32,256] [--threads 2]
        [--repeats 7] [--cpu-time] [--isa avx2] [--log]

SmolLM2-135M's layer shapes (qkv 576 -> 576 + 2 x 192, o 576 -> 576 + residual, gate_up 576 ->
2 x 1536 with the SiLU-gated epilogue, down 1536 -> 576 + residual), bf16 in and out, the same
weights (gguf's quantizer, seed 0) and inputs for both paths, in one process. Each repeat times a
batch of calls of each path in turn (rotating which goes first), so all see the same machine;
the table has the median per call over the repeats and the ratios int16 / int8 and float / int8. The CPU model, ISA level, paths and load average are printed: on a shared machine
read the ratios. --log appends the table to bench/RESULTS-log.md under a dated heading.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import os
import statistics
import sys
import time

import numpy as np
import torch
from gguf import GGMLQuantizationType
from gguf.quants import quantize

from bench.common import RESULTS_LOG
from pagedserve.core.ops.cpu_features import cpu_isa, cpu_model, set_cpu_isa
from pagedserve.core.ops.linear_quant import (
    pack_quant_weight,
    quant_linear,
    quant_linear_float_path,
    quant_linear_int16_path,
    quant_linear_path,
)

# (name, k, n packed columns, residual, gated width)
LAYERS = [("qkv", 576, 960, False, 0), ("o+res", 576, 576, True, 0),
          ("gate_up", 576, 3072, False, 1536), ("down+res", 1536, 576, True, 0)]  # fmt: skip


def packed_weight(qtype: GGMLQuantizationType, n: int, k: int) -> torch.Tensor:
    rng = np.random.default_rng(0)
    blocks = np.ascontiguousarray(quantize(rng.standard_normal((n, k), np.float32), qtype))
    addresses = blocks.ctypes.data + np.arange(n, dtype=np.int64) * blocks.strides[0]
    return pack_quant_weight(int(qtype), addresses, k)


def time_paths(paths: list, calls: int, repeats: int, clock=time.perf_counter) -> list[float]:
    """Median seconds per call of each path over `repeats` rotating batches of `calls`."""
    times: list[list[float]] = [[] for _ in paths]
    for rep in range(repeats):
        for i in range(len(paths)):
            p = (i + rep) % len(paths)
            start = clock()
            for _ in range(calls):
                paths[p]()
            times[p].append((clock() - start) / calls)
    return [statistics.median(t) for t in times]


def run(args: argparse.Namespace) -> list[str]:
    qtype = GGMLQuantizationType[args.type]
    rows = [int(r) for r in args.rows.split(",")]
    lines = ["| layer | rows | int8 acts (us) | int16 acts (us) | float acts (us) | int16 / int8 "
             "| float / int8 | int8 GFLOP/s |", "|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for name, k, n, residual, gated in LAYERS:
        packed = packed_weight(qtype, n, k)
        width = gated or n
        for m in rows:
            gen = torch.Generator().manual_seed(m)
            x = torch.randn(m, k, generator=gen).bfloat16()
            res = torch.randn(m, width, generator=gen).bfloat16() if residual else None
            out = torch.empty(m, width, dtype=torch.bfloat16)

            call = functools.partial(quant_linear, out, x, packed, int(qtype), None, res, gated, 0)
            paths = [functools.partial(call, False, False), functools.partial(call, False, True),
                     functools.partial(call, True, False)]  # fmt: skip
            for path in paths:
                path()  # warm: buffers grown, weights touched
            calls = max(3, min(300, int(1e8 // (m * n * k))))
            clock = time.thread_time if args.cpu_time else time.perf_counter
            t8, t16, tf = time_paths(paths, calls, args.repeats, clock)
            flop = 2 * m * n * k
            lines.append(f"| {name} {k}->{width if not gated else f'2x{gated}'} | {m} "
                         f"| {t8 * 1e6:.1f} | {t16 * 1e6:.1f} | {tf * 1e6:.1f} | {t16 / t8:.2f}x "
                         f"| {tf / t8:.2f}x | {flop / t8 / 1e9:.1f} |")  # fmt: skip
            print(lines[-1], flush=True)
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--type", default="Q4_1", help="GGUF type of the weights (default Q4_1)")
    ap.add_argument("--rows", default="1,32,256", help="row counts (default 1,32,256)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=7, help="alternating batches per path")
    ap.add_argument("--cpu-time", action="store_true",
                    help="time by the thread's CPU time (with --threads 1: a loaded machine's "
                    "preemptions left out)")  # fmt: skip
    ap.add_argument("--isa", default="", help="force an ISA level (default: the CPU's best)")
    ap.add_argument("--log", action="store_true", help="append the table to bench/RESULTS-log.md")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.isa:
        set_cpu_isa(args.isa)
    header = (f"CPU: {cpu_model()}; isa {cpu_isa()}; paths: int8 {quant_linear_path()}, int16 "
              f"{quant_linear_int16_path()}, float {quant_linear_float_path()}; {args.type}; "
              f"threads {args.threads}; {'thread CPU time' if args.cpu_time else 'wall time'}; "
              f"medians of "
              f"{args.repeats} repeats")  # fmt: skip
    print(header)
    load_before = tuple(round(v, 2) for v in os.getloadavg())
    print(f"load average before {load_before}", flush=True)
    lines = run(args)
    load_after = tuple(round(v, 2) for v in os.getloadavg())
    print(f"load average after {load_after}")
    if args.log:
        command = "python -m bench.kernels.quant_float_activations " + " ".join(sys.argv[1:])
        section = [f"\n## {datetime.date.today()}: quantized linear, int8 vs int16 vs float activations "
                   "(issue 42 item 5)", "", f"`{command}`", "", header + ".",
                   f"Load average before {load_before}, after {load_after}.", "", *lines, ""]  # fmt: skip
        with open(RESULTS_LOG, "a") as f:
            f.write("\n".join(section))
        print(f"appended to {RESULTS_LOG}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
