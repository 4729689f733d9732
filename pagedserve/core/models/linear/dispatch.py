"""Which CPU linear path runs a step: the native packed kernel (on AVX512-BF16, or on AMX-BF16
tiles where the CPU has them; at ISA levels avx2 .. avx512 on AVX2 FMAs, bf16 widened in
registers: ops/linear.py's native_linear_path()) or torch's matmul (oneDNN, which also takes AMX
tiles; MKL's fp32 GEMM), chosen by the step's row count from a measurement.

    timings = calibrate(layer_shapes(arch), rows, dtype)   # calibration.py: medians per path
    torch_from_rows(timings), amx_from_rows(timings)        # pure: from which rows each wins
    dispatch = plan_dispatch(mode, deterministic, ...)      # what runs, and why (describe())
    model.route_linears(dispatch.torch_from)                # llama.py: per-layer path there
    model.use_amx(dispatch.amx_from)                        # the native kernel's AMX tiles

The calibration times one decoder layer's four dense projections (qkv, o with its residual,
gate_up with SiLU-and-mul, down with its residual), each as models/linear/dense.py runs it and each
after a native RMSNorm (so torch pays the hand-over between the two OpenMP pools it pays in a
layer), on random weights of the model's shapes, at a few row counts (16, 64, 256 and the
step's token budget, at most 1,024), the two paths alternating, medians of 3-7 calls: 0.26 s
at start-up for the default model in a quiet moment on a 2-core Zen 4, 1.7-2.7 s at load 4-5
(BUDGET_S stops starting larger row counts past 1.5 s). Torch is chosen from the
least measured row count from which it beats native by MARGIN (25 %) at every larger measured
count; a step with fewer rows keeps native (the one-call decoder stack), one with at least that
many runs the layers one by one with torch linears (lm_head stays native: its fp32 logits).
Torch is not batch-invariant: with --deterministic batched steps stay native and the summary
says what torch would have gained. Figures: bench/kernels/linear.py and bench/RESULTS.md (on Zen 4
native wins at every row count; on Intel AMX CPUs oneDNN is 4-10x faster from 64 rows). The
same measurement decides at the AVX2 levels, where the bf16 kernel reads half fp32's bytes but
computes in fp32 at AVX2's width, and torch's bf16 or fp32 matmul takes the CPU's own path
(which --cpu-isa does not lower: a forced level is compared with torch at the CPU's best).

Where the native kernel may use AMX tiles (ops/linear.py's amx_available), the calibration
times it on them too (amx_s) and on AVX-512 summing in the tiles' order (tile_order_s), one row
included, and the AMX path is taken from the least row count from which it beats AVX512-BF16 by
AMX_MARGIN at every larger count. Tiles and AVX512-BF16 may round a sum differently
(linear/amx.hpp), so with --deterministic a threshold is kept only where the rows below it
round as the tiles do on this CPU (tiles_agree_with_avx512(): AVX512-BF16 itself, or the tiles'
order on AVX-512, which the SDM's tiles match bit for bit); otherwise every call runs on tiles
(threshold 1) if they cost one row at most AMX_ONE_ROW_SLACK more, else none does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cache

import torch

from pagedserve.core.models.arch import ArchConfig
from pagedserve.core.models.linear.calibration import (
    REPS,
    Timing,
    layer_shapes,
    measure_layer,
    medians,
)
from pagedserve.core.models.linear.quantized import QuantizedGateUpLinear, QuantizedLinear
from pagedserve.core.ops.cpu_features import cpu_features
from pagedserve.core.ops.linear import (
    PACKABLE_DTYPES,
    amx_available,
    native_linear_available,
    native_linear_path,
    pack_weight,
    packed_linear,
)
from pagedserve.core.ops.linear_quant import quant_amx_available

logger = logging.getLogger(__name__)

MARGIN = 0.25
"""Torch must be this much faster (25 %) to be chosen: noise on a shared machine, and what the
one-call decoder stack saves beyond the linears, stay with native (oneDNN's AMX gains are
4-10x)."""
ROWS = (16, 64, 256)
"""Row counts calibrated below the step's token budget (which is measured too, up to
MAX_ROWS: larger steps take the largest measured count's answer)."""
MAX_ROWS = 1024
AMX_MARGIN = 0.10
"""The native kernel's AMX tiles must be this much faster than its AVX512-BF16 path (10 %): the
same kernel, the same epilogue, so a smaller margin than torch's."""
AMX_ONE_ROW_SLACK = 0.10
"""--deterministic without a bit-identical threshold: AMX at every row count only if one row
(a lone request's decode step) costs at most this much more on tiles."""


def torch_from_rows(timings: Sequence[Timing], margin: float = MARGIN) -> int | None:
    """The least measured row count from which torch beats native (its faster path) by
    `margin` at every larger measured count too; None (never) when native holds at the
    largest."""
    return _wins_from(timings, lambda t: t.torch_s * (1 + margin) < t.best_native_s)


def amx_from_rows(timings: Sequence[Timing], margin: float = AMX_MARGIN) -> int | None:
    """Likewise for the native kernel on AMX tiles against its AVX512-BF16 path."""
    return _wins_from(
        timings, lambda t: t.amx_s is not None and t.amx_s * (1 + margin) < t.native_s
    )


def _wins_from(timings: Sequence[Timing], wins: Callable[[Timing], bool]) -> int | None:
    result = None
    for t in sorted(timings, key=lambda t: t.rows, reverse=True):
        if not wins(t):
            break
        result = t.rows
    return result


@cache
def tiles_agree_with_avx512(tile_order: bool = False) -> bool:
    """Whether the native kernel's AMX tiles give every sum of a [64, 576] x [576, 256] product
    (random bf16, fp32 out) bit for bit as its AVX-512 path does on this CPU (summing in the
    tiles' order with tile_order): then a row threshold between them keeps batch invariance.
    False where there are no tiles."""
    if not amx_available():
        return False
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 576, generator=gen).to(torch.bfloat16)
    packed = pack_weight(torch.randn(256, 576, generator=gen).to(torch.bfloat16))
    outs = [torch.empty(64, 256) for _ in range(2)]
    for out, amx_from in zip(outs, (0, 1), strict=True):
        packed_linear(out, x, packed, None, None, amx_from, tile_order)
    return torch.equal(outs[0], outs[1])


def calibration_rows(max_num_batched_tokens: int, amx: bool = False) -> list[int]:
    """ROWS below the step's budget and the budget (at most MAX_ROWS); one row too with AMX (a
    lone request's decode step, for --deterministic's all-or-nothing choice)."""
    top = min(max_num_batched_tokens, MAX_ROWS)
    return sorted({r for r in ROWS if r < top} | {top} | ({1} if amx else set()))


@dataclass(frozen=True)
class LinearDispatch:
    torch_from: int | None
    """Rows from which the decoder layers' dense linears run torch (None: native throughout)."""
    summary: str
    """What runs the linears and why (the start-up line, /v1/models' `weights`)."""
    timings: tuple[Timing, ...] = ()
    amx_from: int = 0
    """Rows from which the native bf16 kernel runs on AMX tiles (0: never; 1: every call)."""
    amx_tile_order: bool = False
    """Fewer rows sum in the tiles' order (bit for bit the tiles: --deterministic's threshold)."""

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


def plan_dispatch(mode: str, deterministic: bool, inputs: DispatchInputs) -> LinearDispatch:
    """The CPU linear path for ModelConfig.cpu_linear `mode` (auto, native, amx, torch); auto
    measures (measure_layer: tests put timings there)."""
    if inputs.quantized:
        return _fixed("linears: GGUF blocks on their native quantized kernels")
    if inputs.dtype not in PACKABLE_DTYPES or not native_linear_available():
        return _fixed("linears: torch (no native kernel for this dtype on this CPU)")
    amx = inputs.dtype == torch.bfloat16 and amx_available()
    if mode == "amx":
        if not amx:
            raise ValueError(
                "cpu_linear 'amx' needs bfloat16 weights and a CPU with AMX-BF16 tiles that "
                f"Linux grants this process (dtype {inputs.dtype}; cpu: "
                f"{cpu_features().describe()})"
            )
        return _fixed("linears: native on AMX tiles at every row count (cpu_linear amx)", 1)
    if inputs.tensor_parallel or not inputs.dense:
        why = "tensor parallel" if inputs.tensor_parallel else "experts"
        return _fixed(f"linears: native ({why}: no torch dispatch)")
    if mode == "native":
        return _fixed("linears: native at every row count (cpu_linear native)")
    if mode == "torch":
        return LinearDispatch(1, f"linears: torch at every row count (cpu_linear torch); "
                                 f"cpu: {_cpu()}")  # fmt: skip
    rows = calibration_rows(inputs.max_num_batched_tokens, amx)
    shapes = tuple(layer_shapes(inputs.arch))
    timings = tuple(measure_layer(shapes, tuple(rows), inputs.dtype, torch.get_num_threads(), amx))
    logger.info("linear calibration, one layer's qkv+o+gate_up+down, native vs torch%s: %s",
                " vs native on AMX tiles" if amx else "",
                "; ".join(f"{t.rows} rows {t.native_s * 1e3:.3f} vs {t.torch_s * 1e3:.3f}"
                          + (f" vs {t.amx_s * 1e3:.3f}" if t.amx_s is not None else "") + " ms"
                          for t in timings))  # fmt: skip
    amx_from, tile_order, amx_note = _amx_choice(timings, deterministic)
    dispatch = _decide(torch_from_rows(timings), timings, deterministic, amx_note)
    return replace(dispatch, amx_from=amx_from, amx_tile_order=tile_order)


@torch.inference_mode()
def quantized_amx_choice(
    layers: Sequence[torch.nn.Module], rows: Sequence[int], dtype: torch.dtype
) -> tuple[int, str]:
    """For projections kept quantized: from which row count their kernel takes AMX-INT8 tiles,
    measured on `layers` (one decoder layer's own quantized projections) run back to back with
    the VNNI path and on tiles, alternating, at each row count (the tiles give the VNNI path's
    bits, so only speed decides, with or without --deterministic). (amx_from, what the summary
    says) -- (0, "") where the tiles are not available or nothing is quantized."""
    quantized = [m for m in layers if isinstance(m, QuantizedLinear | QuantizedGateUpLinear)]
    if not quantized or not quant_amx_available():
        return 0, ""
    timings = []
    for m in sorted(set(rows)):
        xs = [torch.randn(m, layer.in_features).to(dtype) for layer in quantized]

        def run(from_rows: int, xs: list[torch.Tensor] = xs) -> None:
            for layer, x in zip(quantized, xs, strict=True):
                layer.use_amx(from_rows)
                layer(x)

        vnni_s, tiles_s = medians([lambda: run(0), lambda: run(1)], REPS)
        timings.append(Timing(m, vnni_s, float("inf"), tiles_s))
    for layer in quantized:
        layer.use_amx(0)
    logger.info("quantized kernel calibration, one layer's projections, VNNI vs AMX-INT8: %s",
                "; ".join(f"{t.rows} rows {t.native_s * 1e3:.3f} vs {(t.amx_s or 0.0) * 1e3:.3f} ms"
                          for t in timings))  # fmt: skip
    start = amx_from_rows(timings)
    if start is None:
        best = max(t.amx_speedup for t in timings)
        return 0, f"AMX-INT8 tiles not taken (at best {best:.2f}x of VNNI)"
    gain = max(t.amx_speedup for t in timings if t.rows >= start)
    return start, f"AMX-INT8 tiles from {start} rows (up to {gain:.2f}x VNNI, same bits)"


def _cpu(amx_note: str = "") -> str:
    """The summary's cpu part: the features, and the native dense kernel's path where it runs
    (and what it does with AMX tiles)."""
    text = cpu_features().describe()
    if native_linear_available():
        text += f"; native kernel {native_linear_path()}" + (f": {amx_note}" if amx_note else "")
    return text


def _fixed(reason: str, amx_from: int = 0) -> LinearDispatch:
    return LinearDispatch(None, f"{reason}; cpu: {_cpu()}", amx_from=amx_from)


def _amx_choice(timings: Sequence[Timing], deterministic: bool) -> tuple[int, bool, str]:
    """(amx_from, tile_order, what the summary says of it; "" where the tiles were not
    measured). Without --deterministic: tiles from where they beat AVX512-BF16. With it, a
    threshold needs the rows below it to round as the tiles do: AVX512-BF16 itself where the CPU
    agrees, else the tiles' order on AVX-512 where that agrees and costs one row at most
    AMX_ONE_ROW_SLACK more; failing both, tiles at every row count if one row on them costs no
    more than that, else none."""
    measured = [t for t in timings if t.amx_s is not None]
    if not measured:
        return 0, False, ""
    start = amx_from_rows(measured)
    if start is None:
        best = max(t.amx_speedup for t in measured)
        return 0, False, f"AMX tiles not taken (at best {best:.2f}x of AVX512-BF16)"
    gain = max(t.amx_speedup for t in measured if t.rows >= start)
    taken = f"AMX tiles from {start} rows (up to {gain:.2f}x AVX512-BF16)"
    if start == 1 or not deterministic or tiles_agree_with_avx512():
        return start, False, taken
    one = next((t for t in measured if t.rows == 1), None)
    if one is not None and one.amx_s is not None:
        ordered = _wins_from(measured, lambda t: t.tile_order_s is not None
                             and t.amx_s is not None
                             and t.amx_s * (1 + AMX_MARGIN) < t.tile_order_s)  # fmt: skip
        cheap = one.tile_order_s is not None and one.tile_order_s <= one.native_s * (
            1 + AMX_ONE_ROW_SLACK
        )
        if ordered is not None and ordered > 1 and cheap and tiles_agree_with_avx512(True):
            return ordered, True, (f"AMX tiles from {ordered} rows, fewer rows summed in the "
                                   f"tiles' order (deterministic; up to {gain:.2f}x "
                                   f"AVX512-BF16)")  # fmt: skip
        if one.amx_s <= one.native_s * (1 + AMX_ONE_ROW_SLACK):
            return 1, False, (f"AMX tiles at every row count (deterministic: they round unlike "
                              f"AVX512-BF16; up to {gain:.2f}x it, one row "
                              f"{one.amx_speedup:.2f}x)")  # fmt: skip
    return 0, False, (f"AVX512-BF16 at every row count (deterministic: AMX tiles would be up "
                      f"to {gain:.2f}x faster from {start} rows, --no-deterministic takes "
                      f"them)")  # fmt: skip


def _decide(
    torch_from: int | None, timings: tuple[Timing, ...], deterministic: bool, amx_note: str = ""
) -> LinearDispatch:
    cpu = _cpu(amx_note)
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
