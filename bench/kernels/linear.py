"""The packed native bf16 linear kernel vs torch's bf16 matmul, at SmolLM2-135M's shapes.

    python -m bench.kernels.linear [--repeats 50] [--threads 2] [--dtype float32] [--rows 1,16,64]
    python -m bench.kernels.linear --isa avx2,avx512_bf16 [--dtype float32]   # native per ISA level
    python -m bench.kernels.linear --quantized Q4_1,Q8_0,Q4_K,Q6_K      # the kept-quantized kernels
    python -m bench.kernels.linear --quantized Q4_1,Q8_0 --isa portable,avx2,avx512   # per ISA level

--stat min takes each call's least time of its repeats instead of the median (a machine others
load: the calls still alternate). --dtype float32 compares the kernel's fp32 twin with torch's fp32 matmul (MKL) instead.
--isa (without --quantized) gives the native kernel a column per ISA level, each with its
speed-up over torch (default: every level from avx2 up that the CPU runs; avx2, avx2_vnni and
avx512 run the AVX2 path, avx512_bf16 and amx the AVX512-BF16 one: the line before the table
names each level's path), and the calibration once per level. torch's own kernels take the real
CPU's path whatever the level, so on a CPU with AVX-512 a forced avx2 column is compared with
torch on AVX-512 (on an AVX2-only CPU both are AVX2's).
--quantized times the GGUF kernels (ops/linear_quant.py; int8 activations) beside torch (and
the native bf16 kernel where the CPU has AVX512-BF16) on the same layers at each of --rows: GB/s
of (packed) weights at one row, GFLOP/s at more; a column per type and ISA level of --isa (default:
every level from avx2 up that the CPU runs; 'Q4_1@avx2': the AVX2 path, '@avx512': VNNI, ...);
where the CPU has AMX-INT8 tiles, each type again on them ('/amx'). --dequant-bf16 adds, per type, the
alternative the kernel was chosen against (weights converted to bf16 in registers, AVX512-BF16
dot products with unrounded bf16 activations).

For each layer (qkv, o with its residual add, gate_up, down with its residual, lm_head with fp32
logits) and each row count (default 1, 16, 64, 256, 1024: single-request decode, batched decode
steps, prefill chunks), the median wall time of torch (F.linear / addmm, as llama.py ran them) and of
models.linear.Linear after pack(), interleaved in one run, their ratio, and the achieved
GFLOP/s (or GB/s of weights for one row). Then the start-up calibration of --cpu-linear auto
(models/linear_dispatch.py) on the same model's layer at these row counts, and from which row
count it would run torch. bf16 also times the native kernel summing in the AMX tiles' order on
AVX-512 ('order': what --deterministic runs below a tile threshold), and where the CPU has
AMX-BF16 tiles (and Linux grants them) an `amx` column times it with every call on tiles; the
calibration too. Prints
the CPU model, its features (CPUID: AVX512-BF16, VNNI, AMX)
and the load average: on a shared machine compare the ratios, not the absolute figures.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import quantize

from pagedserve.core.models.linear.calibration import LayerShape, calibrate
from pagedserve.core.models.linear.dense import Linear
from pagedserve.core.models.linear.dispatch import amx_from_rows, torch_from_rows
from pagedserve.core.ops.cpu_features import (
    cpu_features,
    cpu_isa,
    cpu_isa_supported,
    cpu_model,
    forced_cpu_isa,
    runnable_isas,
    set_cpu_isa,
)
from pagedserve.core.ops.linear import (
    amx_available,
    native_linear_available,
    native_linear_path,
)
from pagedserve.core.ops.linear_quant import (
    pack_quant_weight,
    quant_amx_available,
    quant_linear,
    quant_linear_path,
)
from pagedserve.core.ops.native import core

# (name, in_features, out_features, residual add, fp32 output)
LAYERS = (
    ("qkv", 576, 960, False, False),
    ("o+residual", 576, 576, True, False),
    ("gate_up", 576, 3072, False, False),
    ("down+residual", 1536, 576, True, False),
    ("lm_head fp32", 576, 49152, False, True),
)


def torch_call(x: torch.Tensor, w: torch.Tensor, res: torch.Tensor | None, fp32: bool):
    if res is not None:
        return lambda: torch.addmm(res, x, w.t())
    if fp32:
        return lambda: F.linear(x, w).float()
    return lambda: F.linear(x, w)


def gguf_rows(qtype: GGMLQuantizationType, n: int, k: int) -> np.ndarray:
    """[n, row bytes] blocks: gguf's quantizer where it has one, else random K-quant blocks
    (every bit pattern is valid; the fp16 super-block scales set small)."""
    rng = np.random.default_rng(0)
    if qtype in (GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q8_0):
        return np.ascontiguousarray(quantize(rng.standard_normal((n, k), np.float32), qtype))
    block, size = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(n * k // block, size), dtype=np.uint8)
    scale = np.full((len(blocks), 1), 1e-3, np.float16).view(np.uint8)
    offsets = (208,) if qtype == GGMLQuantizationType.Q6_K else (0, 2)
    for offset in offsets:
        blocks[:, offset : offset + 2] = scale
    return blocks.reshape(n, -1)


def dequant_bf16_call(
    out: torch.Tensor, x: torch.Tensor, packed: torch.Tensor, qtype: int, res: torch.Tensor | None
) -> Callable[[], None]:
    """The alternative the kernel measured against: weights to bf16 in registers, dpbf16."""
    m, k = x.shape
    n = out.shape[1]
    res_ptr = 0 if res is None else res.data_ptr()
    return lambda: core.quant_linear(qtype, x.data_ptr(), k, False, packed.data_ptr(), 0,
                                     res_ptr, n, out.data_ptr(), n, out.dtype == torch.float32,
                                     m, n, k, 0, torch.get_num_threads(), False, True)  # fmt: skip


def at_level(level: str, fn: Callable[[], object]) -> Callable[[], None]:
    """fn with the kernels at ISA level `level`, the level before it restored after."""

    def call() -> None:
        before = cpu_isa()
        set_cpu_isa(level)
        try:
            fn()
        finally:
            set_cpu_isa(before)

    return call


def quantized_table(
    types: list[str], row_counts: list[int], repeats: int, dequant: bool, levels: list[str]
) -> None:
    """Each layer x row count: torch bf16, the native bf16 kernel (where the CPU has it) and each
    quantized kernel at each ISA level (int8 activations; with dequant, also each type's
    bf16-in-register alternative)."""
    tiles = quant_amx_available()
    bf16 = native_linear_available()
    paths = {}
    for level in levels:
        with forced_cpu_isa(level):
            paths[level] = quant_linear_path()
    print("quantized kernels: " + ", ".join(f"@{lv} = {p}" for lv, p in paths.items())
          + "; weights GB/s at 1 row use the bytes each kernel reads (packed); "
          + ("'/amx': the same kernel on AMX-INT8 tiles" if tiles else "no AMX-INT8 tiles here"))  # fmt: skip
    for name, k, n, residual, fp32 in LAYERS:
        layer = Linear(k, n).to(torch.bfloat16)
        w = (torch.randn(n, k) * k**-0.5).bfloat16()
        layer.weight.data.copy_(w)  # type: ignore[union-attr]
        if bf16:
            layer.pack()
        packs = []  # (type, packed) of the types whose block size divides k (K-quants: 256)
        for t in types:
            qtype = GGMLQuantizationType[t]
            if k % GGML_QUANT_SIZES[qtype][0]:
                continue
            rows = gguf_rows(qtype, n, k)
            addresses = rows.ctypes.data + np.arange(n, dtype=np.int64) * rows.strides[0]
            packs.append((int(qtype), pack_quant_weight(int(qtype), addresses, k)))
        types_here = [GGMLQuantizationType(q).name for q, _ in packs]
        names = [f"{t}@{lv}" for lv in levels for t in types_here]
        extra = (["bf16"] if dequant else []) + (["amx"] if tiles else [])
        names += [f"{t}/{e}" for e in extra for t in types_here]
        print(f"{name} [k={k}, n={n}]: median us of torch, " + ("bf16, " if bf16 else "")
              + ", ".join(names) + "; then each one's GB/s of weights (1 row) or GFLOP/s")  # fmt: skip
        for m in row_counts:
            x = torch.randn(m, k).bfloat16()
            res = torch.randn(m, n).bfloat16() if residual else None
            out_dtype = torch.float32 if fp32 else torch.bfloat16
            out = torch.empty(m, n, dtype=out_dtype)
            calls = [torch_call(x, w, res, fp32)]
            sizes = [n * k * 2]
            if bf16:
                calls.append(functools.partial(layer, x, res, out_dtype=out_dtype))
                sizes.append(layer.weight_bytes())
            for level in levels:
                calls += [at_level(level, functools.partial(quant_linear, out, x, p, q, None, res, 0))
                          for q, p in packs]  # fmt: skip
            if dequant:
                calls += [dequant_bf16_call(out, x, p, q, res) for q, p in packs]
            if tiles:  # every call on AMX-INT8 tiles
                calls += [functools.partial(quant_linear, out, x, p, q, None, res, 0, 1)
                          for q, p in packs]  # fmt: skip
            times = timed_all(calls, repeats)
            sizes += [p.numel() for _, p in packs] * (len(levels) + len(extra))
            rates = [f"{s / t / 1e9:.0f}GB/s" if m == 1 else f"{2 * m * n * k / t / 1e9:.0f}GF/s"
                     for s, t in zip(sizes, times, strict=True)]  # fmt: skip
            print(f"{name:15s} {m:5d} " + " ".join(f"{t * 1e6:8.0f}" for t in times)
                  + "   " + " ".join(rates))  # fmt: skip


STAT: Callable[[list[float]], float] = statistics.median
"""How a call's repeats make its figure (--stat): median, or min on a machine others load."""


def timed_all(calls: list[Callable[[], object]], repeats: int) -> list[float]:
    """STAT (median) seconds of each call, interleaved so that load falls on all alike."""
    for _ in range(3):
        for fn in calls:
            fn()
    times: list[list[float]] = [[] for _ in calls]
    for _ in range(repeats):
        for fn, ts in zip(calls, times, strict=True):
            start = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - start)
    return [STAT(ts) for ts in times]


def native_on(
    amx_from: int,
    tile_order: bool,
    layer: Linear,
    x: torch.Tensor,
    res: torch.Tensor | None,
    out_dtype: torch.dtype | None,
) -> torch.Tensor:
    """The layer's product with use_amx(amx_from, tile_order) (1: every call on AMX tiles; 0
    with tile_order: on AVX-512 summing in the tiles' order), then back to plain AVX512-BF16."""
    layer.use_amx(amx_from, tile_order)
    try:
        return layer(x, res, out_dtype=out_dtype)
    finally:
        layer.use_amx(0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    ap.add_argument("--rows", default="1,16,64,256,1024", help="row counts, comma-separated")
    ap.add_argument("--quantized", default="", help="GGUF types to time, e.g. Q4_1,Q8_0")
    ap.add_argument("--isa", default="",
                    help="ISA levels, comma-separated (default: avx2 and up)")  # fmt: skip
    ap.add_argument("--dequant-bf16", action="store_true",
                    help="with --quantized: also time the bf16-in-register alternative")  # fmt: skip
    ap.add_argument("--stat", choices=("median", "min"), default="median",
                    help="each call's figure from its repeats (min: the least loaded)")  # fmt: skip
    args = ap.parse_args()
    global STAT
    STAT = min if args.stat == "min" else statistics.median
    dtype = getattr(torch, args.dtype)
    torch.set_num_threads(args.threads)
    row_counts = [int(r) for r in args.rows.split(",")]
    print(f"CPU: {cpu_model() or 'unknown'} ({cpu_features().describe()})")
    print(f"load average before: {os.getloadavg()}; threads {args.threads}; {args.dtype}; "
          f"{args.stat} of the repeats")  # fmt: skip
    asked = args.isa.split(",") if args.isa else [lv for lv in runnable_isas() if lv != "portable"]
    if args.quantized:
        levels = [lv for lv in asked if lv in runnable_isas()]
        if skipped := [lv for lv in asked if lv not in levels]:
            print(f"ISA levels above this CPU's ({cpu_isa_supported()}), skipped: {skipped}")
        quantized_table(args.quantized.split(","), row_counts, args.repeats, args.dequant_bf16,
                        levels)  # fmt: skip
        print(f"load average after: {os.getloadavg()}")
        return
    levels = [lv for lv in asked if lv in runnable_isas() and path_at(lv) != "none"]
    if skipped := [lv for lv in asked if lv not in levels]:
        print(f"ISA levels without a native path on this CPU (up to {cpu_isa_supported()}), "
              f"skipped: {skipped}")  # fmt: skip
    if not levels:
        raise SystemExit(
            "no ISA level with the native kernel here (it needs avx2): nothing to time"
        )
    dense_table(levels, row_counts, dtype, args.repeats)
    for level in levels:
        with forced_cpu_isa(level):
            dispatch_table(row_counts, dtype, level)
    print(f"load average after: {os.getloadavg()}")


def path_at(level: str) -> str:
    with forced_cpu_isa(level):
        return native_linear_path()


def dense_table(levels: list[str], row_counts: list[int], dtype: torch.dtype, repeats: int) -> None:
    """Each layer x row count: torch, the native kernel at each level (and its speed-up), and on
    AVX512-BF16 the tiles' order and AMX tiles where they run."""
    best = cpu_isa_supported()
    bf16_path = dtype == torch.bfloat16 and path_at(best) == "avx512_bf16"
    amx = bf16_path and amx_available()
    order = bf16_path  # the tiles' order on AVX-512 runs on any AVX512-BF16 CPU
    print("native paths: " + ", ".join(f"@{lv} = {path_at(lv)}" for lv in levels))
    print("AMX tiles: the native kernel's 'amx' column" if amx else
          "AMX tiles: none here (no amx_bf16 in CPUID, not granted, or float32): no amx column")  # fmt: skip
    print(f"{'layer':15s} {'rows':>5s} {'torch us':>9s}"
          + "".join(f" {'@' + lv + ' us':>15s} {'speed-up':>8s}" for lv in levels)
          + (f" {'order us':>9s} {'order/nat':>9s}" if order else "")
          + (f" {'amx us':>9s} {'amx/native':>10s}" if amx else "")
          + "  native@" + levels[-1])  # fmt: skip
    for name, k, n, residual, fp32 in LAYERS:
        layer = Linear(k, n).to(dtype)
        w = (torch.randn(n, k) * k**-0.5).to(dtype)
        layer.weight.data.copy_(w)  # type: ignore[union-attr]
        layer.pack()  # one packed layout for every path
        for rows in row_counts:
            x = torch.randn(rows, k).to(dtype)
            res = torch.randn(rows, n).to(dtype) if residual else None
            out_dtype = torch.float32 if fp32 else None
            ours = functools.partial(layer, x, res, out_dtype=out_dtype)
            calls = [torch_call(x, w, res, fp32)] + [at_level(lv, ours) for lv in levels]
            if order:
                calls.append(functools.partial(native_on, 0, True, layer, x, res, out_dtype))
            if amx:
                calls.append(functools.partial(native_on, 1, False, layer, x, res, out_dtype))
            reps = repeats if rows * n * k < 2**28 else max(5, repeats // 10)
            theirs, *times = timed_all(calls, reps)
            natives, others = times[: len(levels)], times[len(levels) :]
            mine = natives[-1]
            rate = (
                f"{n * k * w.element_size() / mine / 1e9:.1f} GB/s of weights"
                if rows == 1
                else f"{2 * rows * n * k / mine / 1e9:.0f} GFLOP/s"
            )
            columns = "".join(f" {t * 1e6:15.0f} {theirs / t:7.2f}x" for t in natives)
            extra = "".join(f" {t * 1e6:9.0f} {mine / t:9.2f}x" for t in others)
            print(f"{name:15s} {rows:5d} {theirs * 1e6:9.0f}{columns}{extra}  {rate}")


def dispatch_table(row_counts: list[int], dtype: torch.dtype, level: str) -> None:
    """--cpu-linear auto's calibration on this model's decoder layer (no time budget), at the
    ISA level now set."""
    shapes = [LayerShape("qkv", 576, 960), LayerShape("o", 576, 576, residual=True),
              LayerShape("gate_up", 576, 1536, gated=True),
              LayerShape("down", 1536, 576, residual=True)]  # fmt: skip
    amx = dtype == torch.bfloat16 and amx_available()
    timings = calibrate(shapes, row_counts, dtype, budget_s=float("inf"), amx=amx)
    print(f"calibration (--cpu-linear auto) at {level} (native {native_linear_path()}), one "
          "layer's qkv+o+gate_up+down:")  # fmt: skip
    for t in timings:
        tiles = (f"  amx {t.amx_s * 1e6:9.0f} us ({t.amx_speedup:.2f}x native), tile order "
                 f"{(t.tile_order_s or 0) * 1e6:9.0f} us" if t.amx_s else "")  # fmt: skip
        print(f"  {t.rows:5d} rows  native {t.native_s * 1e6:9.0f} us  torch "
              f"{t.torch_s * 1e6:9.0f} us  native vs torch {t.torch_s / t.native_s:6.2f}x{tiles}")  # fmt: skip
    start, tiles_from = torch_from_rows(timings), amx_from_rows(timings)
    print(f"  -> torch from {start} rows" if start else "  -> native at every row count")
    if amx:
        print(f"  -> AMX tiles from {tiles_from} rows (--no-deterministic)" if tiles_from
              else "  -> AMX tiles never")  # fmt: skip


if __name__ == "__main__":
    main()
