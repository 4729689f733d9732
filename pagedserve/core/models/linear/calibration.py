"""The calibration models/linear/dispatch.py decides from: one decoder layer's dense projections
timed on the native kernel and on torch's matmul (and, where the CPU has them, on AMX tiles), at
a few row counts, on random weights of the model's own shapes.

    timings = calibrate(layer_shapes(arch), rows, dtype)   # medians per path and row count
    timings = measure_layer(shapes, rows, dtype, threads, amx)   # the same, once per process

Each projection runs as models/linear/dense.py runs it, after a native RMSNorm (so torch pays the
hand-over between the two OpenMP pools it pays in a layer); the paths alternate, medians of
REPS calls, and BUDGET_S stops starting larger row counts.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache

import torch

from pagedserve.core.models.arch import ArchConfig
from pagedserve.core.models.linear.dense import GateUpLinear, Linear, PackableLinear
from pagedserve.core.ops import layer_ops
from pagedserve.core.ops.linear import (
    native_linear_path,
)

REPS = (3, 7)
"""Timed calls per path and row count: at least 3, up to 7 while ROW_TIME_S allows."""
ROW_TIME_S = 0.25
BUDGET_S = 1.5
"""Start-up time the calibration may take; larger row counts are skipped past it."""


@dataclass(frozen=True)
class LayerShape:
    name: str
    in_features: int
    out_features: int  # gate_up: the width (the layer's weight has twice as many rows)
    gated: bool = False
    residual: bool = False


@dataclass(frozen=True)
class Timing:
    """One decoder layer's dense projections at `rows` rows: median seconds per path."""

    rows: int
    native_s: float
    torch_s: float
    amx_s: float | None = None
    """The native kernel on AMX tiles (None: not measured, no AMX here)."""
    tile_order_s: float | None = None
    """The native kernel on AVX-512 summing in the tiles' order (measured with amx_s)."""

    @property
    def best_native_s(self) -> float:
        return self.native_s if self.amx_s is None else min(self.native_s, self.amx_s)

    @property
    def torch_speedup(self) -> float:
        return self.best_native_s / self.torch_s

    @property
    def amx_speedup(self) -> float:
        return self.native_s / self.amx_s if self.amx_s else 0.0


def layer_shapes(arch: ArchConfig) -> list[LayerShape]:
    """The four dense projections of one of the model's decoder layers."""
    hidden, head = arch.hidden_size, arch.head_size
    return [
        LayerShape("qkv", hidden, (arch.num_heads + 2 * arch.num_kv_heads) * head),
        LayerShape("o", arch.num_heads * head, hidden, residual=True),
        LayerShape("gate_up", hidden, arch.intermediate_size, gated=True),
        LayerShape("down", arch.intermediate_size, hidden, residual=True),
    ]


def _layers(shape: LayerShape, dtype: torch.dtype, amx: bool) -> list[PackableLinear] | None:
    """[native, torch] layers of this shape on one random weight, and if `amx` native on AMX
    tiles and native in the tiles' order; None where it cannot pack."""
    layers: list[PackableLinear] = [
        GateUpLinear(shape.in_features, shape.out_features)
        if shape.gated
        else Linear(shape.in_features, shape.out_features)
        for _ in range(4 if amx else 2)
    ]
    weight = torch.randn(layers[0].out_features, shape.in_features).mul_(0.05).to(dtype)
    for layer in layers:  # all share the one tensor
        layer.weight = torch.nn.Parameter(weight, requires_grad=False)
    if not layers[0].pack():
        return None
    if amx:  # the native kernel's other two paths read the one packed copy
        for layer in layers[2:]:
            layer.packed, layer.weight = layers[0].packed, None
        layers[2].use_amx(1)
        layers[3].use_amx(0, tile_order=True)
    return layers


def _runner(layer: PackableLinear, shape: LayerShape, x: torch.Tensor) -> Callable[[], object]:
    """The projection after a native RMSNorm of its input, as in a layer (norms, rotary and
    attention run natively between the projections): torch's matmul pays the hand-over
    between the native kernels' OpenMP threads and torch's own each time, as it does there."""
    norm = torch.ones(shape.in_features, dtype=x.dtype)
    if shape.residual:
        residual = torch.zeros(x.shape[0], shape.out_features, dtype=x.dtype)
        return lambda: layer(layer_ops.rms_norm(x, norm, 1e-6), residual=residual)
    return lambda: layer(layer_ops.rms_norm(x, norm, 1e-6))


def _layer(runs: Sequence[Callable[[], object]]) -> Callable[[], None]:
    def run() -> None:
        for fn in runs:
            fn()

    return run


def medians(fns: Sequence[Callable[[], object]], reps: tuple[int, int]) -> list[float]:
    """Medians in seconds of each of fns, taking turns after one warm-up call each."""
    for fn in fns:
        fn()
    times: list[list[float]] = [[] for _ in fns]
    start = time.perf_counter()
    while len(times[0]) < reps[0] or (
        len(times[0]) < reps[1] and time.perf_counter() - start < ROW_TIME_S
    ):
        for fn, out in zip(fns, times, strict=True):
            begin = time.perf_counter()
            fn()
            out.append(time.perf_counter() - begin)
    return [statistics.median(t) for t in times]


@torch.inference_mode()
def calibrate(
    shapes: Sequence[LayerShape],
    rows: Sequence[int],
    dtype: torch.dtype,
    reps: tuple[int, int] = REPS,
    budget_s: float = BUDGET_S,
    amx: bool = False,
) -> list[Timing]:
    """Native vs torch (and native on AMX tiles and in the tiles' order if `amx`) over one
    layer's projections run back to back, at each row count (ascending); row counts after the
    budget is spent are skipped (the log names what was measured). Empty where the native
    kernel does not take `dtype` on this CPU."""
    layers = [_layers(shape, dtype, amx) for shape in shapes]
    if any(ls is None for ls in layers):
        return []
    start, timings = time.perf_counter(), list[Timing]()
    for m in sorted(set(rows)):
        if timings and time.perf_counter() - start > budget_s:
            break
        runs: list[list[Callable[[], object]]] = [[] for _ in range(4 if amx else 2)]
        for shape, shape_layers in zip(shapes, layers, strict=True):
            assert shape_layers is not None
            x = torch.randn(m, shape.in_features).to(dtype)
            for path, layer in zip(runs, shape_layers, strict=True):
                path.append(_runner(layer, shape, x))
        native_s, torch_s, *tiles = medians([_layer(r) for r in runs], reps)
        timings.append(Timing(m, native_s, torch_s, *tiles))
    return timings


def measure_layer(
    shapes: tuple[LayerShape, ...],
    rows: tuple[int, ...],
    dtype: torch.dtype,
    threads: int,
    amx: bool = False,
) -> tuple[Timing, ...]:
    """calibrate(), once per process for each shape, row counts, dtype, thread count, AMX
    choice and native path (--cpu-isa may differ between engines of one process): an engine
    built again (tests, LLM objects) reuses the figures."""
    return _measure_once(shapes, rows, dtype, threads, amx, native_linear_path())


@cache
def _measure_once(
    shapes: tuple[LayerShape, ...],
    rows: tuple[int, ...],
    dtype: torch.dtype,
    threads: int,
    amx: bool,
    path: str,
) -> tuple[Timing, ...]:
    return tuple(calibrate(shapes, rows, dtype, amx=amx))
