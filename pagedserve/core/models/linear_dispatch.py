"""Which CPU linear path runs a step: the native packed kernel or torch's matmul (oneDNN, which
takes AMX tiles where the CPU has them), chosen by the step's row count from a measurement.

    timings = calibrate(layer_shapes(arch), rows, dtype)   # medians, the model's own shapes
    torch_from_rows(timings)                                # pure: from which rows torch wins
    dispatch = plan_dispatch(mode, deterministic, ...)      # what runs, and why (describe())
    model.route_linears(dispatch.torch_from)                # llama.py: per-layer path there

The calibration times one decoder layer's four dense projections (qkv, o with its residual,
gate_up with SiLU-and-mul, down with its residual), each as models/linear.py runs it and each
after a native RMSNorm (so torch pays the hand-over between the two OpenMP pools it pays in a
layer), on random weights of the model's shapes, at a few row counts (16, 64, 256 and the
step's token budget, at most 1,024), the two paths alternating, medians of 3-7 calls: 0.26 s
at start-up for the default model in a quiet moment on a 2-core Zen 4, 1.7-2.7 s at load 4-5
(BUDGET_S stops starting larger row counts past 1.5 s). Torch is chosen from the
least measured row count from which it beats native by MARGIN (25 %) at every larger measured
count; a step with fewer rows keeps native (the one-call decoder stack), one with at least that
many runs the layers one by one with torch linears (lm_head stays native: its fp32 logits).
Torch is not batch-invariant: with --deterministic batched steps stay native and the summary
says what torch would have gained. Figures: bench/linear.py and bench/RESULTS.md (on Zen 4
native wins at every row count; on Intel AMX CPUs oneDNN is 4-10x faster from 64 rows).
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache

import torch

from pagedserve.core.models.arch import ArchConfig
from pagedserve.core.models.linear import GateUpLinear, Linear, PackableLinear
from pagedserve.core.ops import layer_ops
from pagedserve.core.ops.cpu_features import cpu_features
from pagedserve.core.ops.linear import PACKABLE_DTYPES, native_linear_available

logger = logging.getLogger(__name__)

MARGIN = 0.25
"""Torch must be this much faster (25 %) to be chosen: noise on a shared machine, and what the
one-call decoder stack saves beyond the linears, stay with native (oneDNN's AMX gains are
4-10x)."""
ROWS = (16, 64, 256)
"""Row counts calibrated below the step's token budget (which is measured too, up to
MAX_ROWS: larger steps take the largest measured count's answer)."""
MAX_ROWS = 1024
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

    @property
    def torch_speedup(self) -> float:
        return self.native_s / self.torch_s


def layer_shapes(arch: ArchConfig) -> list[LayerShape]:
    """The four dense projections of one of the model's decoder layers."""
    hidden, head = arch.hidden_size, arch.head_size
    return [
        LayerShape("qkv", hidden, (arch.num_heads + 2 * arch.num_kv_heads) * head),
        LayerShape("o", arch.num_heads * head, hidden, residual=True),
        LayerShape("gate_up", hidden, arch.intermediate_size, gated=True),
        LayerShape("down", arch.intermediate_size, hidden, residual=True),
    ]


def torch_from_rows(timings: Sequence[Timing], margin: float = MARGIN) -> int | None:
    """The least measured row count from which torch beats native by `margin` at every larger
    measured count too; None (never) when native holds at the largest."""
    result = None
    for t in sorted(timings, key=lambda t: t.rows, reverse=True):
        if t.torch_s * (1 + margin) >= t.native_s:
            break
        result = t.rows
    return result


def _pair(shape: LayerShape, dtype: torch.dtype) -> tuple[PackableLinear, PackableLinear] | None:
    """(native, torch) layers of this shape on one random weight; None where it cannot pack."""
    layers = [
        GateUpLinear(shape.in_features, shape.out_features)
        if shape.gated
        else Linear(shape.in_features, shape.out_features)
        for _ in range(2)
    ]
    weight = torch.randn(layers[0].out_features, shape.in_features).mul_(0.05).to(dtype)
    for layer in layers:  # both share the one tensor
        layer.weight = torch.nn.Parameter(weight, requires_grad=False)
    return (layers[0], layers[1]) if layers[0].pack() else None


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


def _median_pair(
    a: Callable[[], object], b: Callable[[], object], reps: tuple[int, int]
) -> tuple[float, ...]:
    """Medians in seconds of a and b, alternating after one warm-up call each."""
    a(), b()
    times: tuple[list[float], list[float]] = ([], [])
    start = time.perf_counter()
    while len(times[0]) < reps[0] or (
        len(times[0]) < reps[1] and time.perf_counter() - start < ROW_TIME_S
    ):
        for fn, out in ((a, times[0]), (b, times[1])):
            begin = time.perf_counter()
            fn()
            out.append(time.perf_counter() - begin)
    return statistics.median(times[0]), statistics.median(times[1])


@torch.inference_mode()
def calibrate(
    shapes: Sequence[LayerShape],
    rows: Sequence[int],
    dtype: torch.dtype,
    reps: tuple[int, int] = REPS,
    budget_s: float = BUDGET_S,
) -> list[Timing]:
    """Native vs torch over one layer's projections run back to back, at each row count
    (ascending); row counts after the budget is spent are skipped (the log names what was
    measured). Empty where the native kernel does not take `dtype` on this CPU."""
    pairs = [_pair(shape, dtype) for shape in shapes]
    if any(p is None for p in pairs):
        return []
    start, timings = time.perf_counter(), list[Timing]()
    for m in sorted(set(rows)):
        if timings and time.perf_counter() - start > budget_s:
            break
        runs: tuple[list[Callable[[], object]], list[Callable[[], object]]] = ([], [])
        for shape, pair in zip(shapes, pairs, strict=True):
            assert pair is not None
            x = torch.randn(m, shape.in_features).to(dtype)
            runs[0].append(_runner(pair[0], shape, x))
            runs[1].append(_runner(pair[1], shape, x))
        native_s, torch_s = _median_pair(_layer(runs[0]), _layer(runs[1]), reps)
        timings.append(Timing(m, native_s, torch_s))
    return timings


@cache
def measure_layer(
    shapes: tuple[LayerShape, ...], rows: tuple[int, ...], dtype: torch.dtype, threads: int
) -> tuple[Timing, ...]:
    """calibrate(), once per process for each shape, row counts, dtype and thread count: an
    engine built again (tests, LLM objects) reuses the figures."""
    return tuple(calibrate(shapes, rows, dtype))


def calibration_rows(max_num_batched_tokens: int) -> list[int]:
    top = min(max_num_batched_tokens, MAX_ROWS)
    return sorted({r for r in ROWS if r < top} | {top})


@dataclass(frozen=True)
class LinearDispatch:
    torch_from: int | None
    """Rows from which the decoder layers' dense linears run torch (None: native throughout)."""
    summary: str
    """What runs the linears and why (the start-up line, /v1/models' `weights`)."""
    timings: tuple[Timing, ...] = ()

    @property
    def keeps_weights(self) -> bool:
        """The layers keep their [out, in] weights beside the packed ones (for torch)."""
        return self.torch_from is not None


@dataclass(frozen=True)
class DispatchInputs:
    """What plan_dispatch needs to know of the model and the run."""

    arch: ArchConfig
    dtype: torch.dtype
    max_num_batched_tokens: int
    quantized: bool = False
    """GGUF blocks kept quantized: their native kernels run, whatever the mode."""
    tensor_parallel: bool = False
    dense: bool = True
    """Every decoder layer has its four dense projections (no experts): they can run torch."""


def _fixed(reason: str) -> LinearDispatch:
    return LinearDispatch(None, f"{reason}; cpu: {cpu_features().describe()}")


def plan_dispatch(mode: str, deterministic: bool, inputs: DispatchInputs) -> LinearDispatch:
    """The CPU linear path for ModelConfig.cpu_linear `mode` (auto, native, torch); auto
    measures (measure_layer: tests put timings there)."""
    if inputs.quantized:
        return _fixed("linears: GGUF blocks on their native quantized kernels")
    if inputs.dtype not in PACKABLE_DTYPES or not native_linear_available():
        return _fixed("linears: torch (no native kernel for this dtype on this CPU)")
    if inputs.tensor_parallel or not inputs.dense:
        why = "tensor parallel" if inputs.tensor_parallel else "experts"
        return _fixed(f"linears: native ({why}: no torch dispatch)")
    if mode == "native":
        return _fixed("linears: native at every row count (cpu_linear native)")
    if mode == "torch":
        return LinearDispatch(1, f"linears: torch at every row count (cpu_linear torch); "
                                 f"cpu: {cpu_features().describe()}")  # fmt: skip
    rows = calibration_rows(inputs.max_num_batched_tokens)
    shapes = tuple(layer_shapes(inputs.arch))
    timings = tuple(measure_layer(shapes, tuple(rows), inputs.dtype, torch.get_num_threads()))
    logger.info("linear calibration, one layer's qkv+o+gate_up+down, native vs torch: %s",
                "; ".join(f"{t.rows} rows {t.native_s * 1e3:.3f} vs {t.torch_s * 1e3:.3f} ms"
                          for t in timings))  # fmt: skip
    return _decide(torch_from_rows(timings), timings, deterministic)


def _decide(
    torch_from: int | None, timings: tuple[Timing, ...], deterministic: bool
) -> LinearDispatch:
    cpu = cpu_features().describe()
    if torch_from is None:
        best = max((t.torch_speedup for t in timings), default=0.0)
        measured = f"torch at best {best:.2f}x of native" if timings else "not measured"
        return LinearDispatch(None, f"linears: native at every row count (calibrated: "
                                    f"{measured}); cpu: {cpu}", timings)  # fmt: skip
    gain = max(t.torch_speedup for t in timings if t.rows >= torch_from)
    if deterministic:
        return LinearDispatch(None, f"linears: native at every row count (deterministic; torch "
                                    f"would be up to {gain:.2f}x faster from {torch_from} rows, "
                                    f"--no-deterministic takes it); cpu: {cpu}",
                              timings)  # fmt: skip
    return LinearDispatch(torch_from, f"linears: native below {torch_from} rows, torch from "
                                      f"{torch_from} (calibrated: up to {gain:.2f}x faster); "
                                      f"cpu: {cpu}", timings)  # fmt: skip
