"""How many AVX2 int8-kernel instructions this CPU retires a cycle (issue 24): the bound the
quantized kernel's inner loop runs against on a CPU without VNNI.

    python -m bench.kernels.cpu_pipes             # 3 runs, medians, then the kernel at avx2
    python -m bench.kernels.cpu_pipes --runs 5 --types Q4_1,Q8_0

Compiles bench/kernels/cpu_pipes.cpp with g++ (-O2 -mavx2 -mfma) into bench/.work/ and runs it: the
clock measured by a chain of dependent adds (this VM reports only the nominal clock and has no
cycle counters), then instructions per cycle of each of the kernel's vector instructions alone
and in mixes (a mix that sums to one instruction's rate shares its pipes). Then, between two
more clock readings, the quantized kernel itself at level avx2 on one thread (SmolLM2-135M's
gate_up layer, 576 -> 2 x 1536 with its SiLU-gated epilogue, 1,024 rows; gguf's quantizer,
seed 0): int8 products per second and per cycle. Prints markdown tables with the CPU model.
Needs an x86-64 CPU with AVX2 and FMA.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.common import WORK
from pagedserve.core.ops.cpu_features import cpu_model


def kernel_products_per_s(qtype_name: str, m: int = 1024, k: int = 576, n: int = 1536) -> float:
    """int8 products a second of the quantized kernel at avx2, 1 thread, on gate_up (median)."""
    import numpy as np
    import torch
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    from pagedserve.core.ops.cpu_features import set_cpu_isa
    from pagedserve.core.ops.linear_quant import pack_quant_weight, quant_linear, quant_linear_path

    torch.set_num_threads(1)
    set_cpu_isa("avx2")
    assert quant_linear_path() == "avx2", quant_linear_path()
    qtype = GGMLQuantizationType[qtype_name]
    weight = np.random.default_rng(0).standard_normal((2 * n, k), np.float32)
    blocks = np.ascontiguousarray(quantize(weight, qtype))
    addresses = blocks.ctypes.data + np.arange(2 * n, dtype=np.int64) * blocks.strides[0]
    packed = pack_quant_weight(int(qtype), addresses, k)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(0)).bfloat16()
    out = torch.empty(m, n, dtype=torch.bfloat16)
    times = []
    for _ in range(15):
        start = time.perf_counter()
        quant_linear(out, x, packed, int(qtype), None, None, n)
        times.append(time.perf_counter() - start)
    return m * 2 * n * k / statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--types", default="Q4_1,Q8_0", help="kernel types to time ('' for none)")
    args = ap.parse_args()
    flags = Path("/proc/cpuinfo").read_text().split()
    if "avx2" not in flags or "fma" not in flags:
        print("cpu_pipes: this CPU lacks AVX2 or FMA", file=sys.stderr)
        return 2
    exe = WORK / "cpu_pipes"
    exe.parent.mkdir(parents=True, exist_ok=True)
    source = Path(__file__).with_name("cpu_pipes.cpp")
    subprocess.run(["g++", "-O2", "-std=c++17", "-mavx2", "-mfma", "-o", exe, source], check=True)

    def measure() -> dict[str, float]:
        out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
        return json.loads(out)

    runs = [measure() for _ in range(args.runs)]
    print(f"CPU: {cpu_model()}; medians of {args.runs} runs, 1 thread")
    print("| measure | per cycle (clock: GHz) |")
    print("|---|---:|")
    for key in runs[0]:
        print(f"| {key} | {statistics.median(r[key] for r in runs):.2f} |")
    types = [t for t in args.types.split(",") if t]
    if types:
        head = "kernel at avx2, gate_up 1024 rows | G products/s | clock before / after GHz"
        print(f"\n| {head} | products per cycle |")
        print("|---|---:|---:|---:|")
    for name in types:
        before = measure()["clock_ghz"]
        rate = kernel_products_per_s(name)
        after = measure()["clock_ghz"]
        per_cycle = rate / (1e9 * (before + after) / 2)
        print(f"| {name} | {rate / 1e9:.1f} | {before:.2f} / {after:.2f} | {per_cycle:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
