"""The packed native bf16 linear kernel vs torch's bf16 matmul, at SmolLM2-135M's shapes.

    python bench/linear.py [--repeats 50] [--threads 2] [--dtype float32]

--dtype float32 compares the kernel's fp32 twin with torch's fp32 matmul (MKL) instead.

For each layer (qkv, o with its residual add, gate_up, down with its residual, lm_head with fp32
logits) and each row count (1: single-request decode, 64: a batch-64 decode step, 512: a
prefill chunk), the median wall time of torch (F.linear / addmm, as llama.py ran them) and of
models.linear.Linear after pack(), interleaved in one run, their ratio, and the achieved
GFLOP/s (or GB/s of weights for one row). Prints the load average: on a shared machine compare
the ratios, not the absolute figures.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from pagedserve.core.models.linear import Linear
from pagedserve.core.ops.linear import native_linear_available

# (name, in_features, out_features, residual add, fp32 output)
LAYERS = (
    ("qkv", 576, 960, False, False),
    ("o+residual", 576, 576, True, False),
    ("gate_up", 576, 3072, False, False),
    ("down+residual", 1536, 576, True, False),
    ("lm_head fp32", 576, 49152, False, True),
)


def timed_pair(
    a: Callable[[], object], b: Callable[[], object], repeats: int
) -> tuple[float, float]:
    """Medians in seconds, a and b alternating so that load falls on both alike."""
    for _ in range(3):
        a(), b()
    ta, tb = [], []
    for _ in range(repeats):
        for fn, times in ((a, ta), (b, tb)):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    return statistics.median(ta), statistics.median(tb)


def torch_call(x: torch.Tensor, w: torch.Tensor, res: torch.Tensor | None, fp32: bool):
    if res is not None:
        return lambda: torch.addmm(res, x, w.t())
    if fp32:
        return lambda: F.linear(x, w).float()
    return lambda: F.linear(x, w)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    if not native_linear_available():
        raise SystemExit("this CPU has no AVX512-BF16: the native kernel does not apply")
    torch.set_num_threads(args.threads)
    print(f"load average before: {os.getloadavg()}; threads {args.threads}; {args.dtype}")
    print(
        f"{'layer':15s} {'rows':>5s} {'torch us':>9s} {'native us':>10s} {'speed-up':>8s}  native"
    )
    for name, k, n, residual, fp32 in LAYERS:
        layer = Linear(k, n).to(dtype)
        w = (torch.randn(n, k) * k**-0.5).to(dtype)
        layer.weight.data.copy_(w)  # type: ignore[union-attr]
        layer.pack()
        for rows in (1, 64, 512):
            x = torch.randn(rows, k).to(dtype)
            res = torch.randn(rows, n).to(dtype) if residual else None
            out_dtype = torch.float32 if fp32 else None
            ours = functools.partial(layer, x, res, out_dtype=out_dtype)
            theirs, mine = timed_pair(torch_call(x, w, res, fp32), ours, args.repeats)
            rate = (
                f"{n * k * w.element_size() / mine / 1e9:.1f} GB/s of weights"
                if rows == 1
                else f"{2 * rows * n * k / mine / 1e9:.0f} GFLOP/s"
            )
            print(f"{name:15s} {rows:5d} {theirs * 1e6:9.0f} {mine * 1e6:10.0f} "
                  f"{theirs / mine:7.2f}x  {rate}")  # fmt: skip
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
