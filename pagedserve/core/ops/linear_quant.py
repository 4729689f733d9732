"""The quantized linear kernel of pagedserve._core as an op: GGUF Q4_0, Q4_1, Q8_0, Q4_K, Q5_K
and Q6_K weights kept in their blocks (repacked once), int8 activations, AVX512-VNNI dot
products where the CPU has them, AVX2 (vpmaddubsw) or portable loops elsewhere, chosen at run
time by the ISA level; every path gives the same bits.

    packed = pack_quant_weight(ggml_type, rows, k)     GGUF rows (addresses) -> kernel tiles
    quant_linear(out, x, packed, ggml_type, bias, residual, gated_width)
        out = x W^T (+ bias) (+ residual), or silu(x W_gate^T) * (x W_up^T) when gated_width
    quant_linear(..., amx_from_rows=64)                calls of >= 64 rows on AMX-INT8 tiles
    quant_linear(..., float_activations=True)          x kept in fp32: no int8 rounding
    quant_linear(..., int16_activations=True)          x rounded to int16 per 32 features

float_activations (issue 42): x used as fp32 (bf16 widened exactly), each weight dequantized in
registers (w = fma(scale, u, min), exact), one fp32 FMA chain over k per output: the product of
x with the dequantized weight up to fp32 summation, for models too small to survive int8
activations (SmolLM2-135M). AVX2 + FMA from ISA level avx2 up, portable loops elsewhere
(quant_linear_float_path()); batch-invariant on every level, not bit-equal across levels.

int16_activations (issue 42): x rounded to int16 per 32 features (d = max|x| / 32512) and
carried as two int8 parts q = 255 hi + lo through the int8 kernels, whose int32 sums stay exact:
2^-15 of a block's largest value where int8 keeps 2^-7, at about twice the int8 multiplies.
SmolLM2-135M gives the dequantized model's greedy tokens with it. The AVX512-VNNI kernel from
ISA level avx512 on CPUs that have it (and its AMX-INT8 tiles from amx_from_rows rows, two tile
products a group), else the AVX2 kernel (or its AVX-VNNI
copy) from level avx2 up; portable loops elsewhere (quant_linear_int16_path()); the same bits on
every level.

Batch-invariant like the bf16 kernel: each output is the same operations in the same order
whatever the number of rows; the AMX-INT8 tiles give the VNNI path's bits (exact int32 sums),
so a row threshold keeps that. models/linear/quantized.py holds the layers that use it.
"""

from __future__ import annotations

import numpy as np
import torch

from pagedserve.core.ops import native
from pagedserve.core.ops.base import NativeOp
from pagedserve.core.ops.linear import check_epilogue
from pagedserve.core.ops.native import require

_core = native.core

QUANT_TYPES = frozenset({2, 3, 8, 12, 13, 14})
"""ggml type ids with a kernel: Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K."""
_DTYPES = (torch.bfloat16, torch.float32)


def quant_linear_path() -> str:
    """The path of the active ISA level (ops/cpu_features.py): "avx512-vnni", "avx2" or
    "portable" (AMX-INT8 tiles come on top of avx512-vnni, by row count)."""
    return str(_core.quant_linear_path())


def quant_linear_float_path() -> str:
    """The path float_activations=True runs at the active ISA level: "avx2" or "portable"."""
    return str(_core.quant_linear_float_path())


def quant_linear_int16_path() -> str:
    """The path int16_activations=True runs at the active ISA level: "avx512-vnni",
    "avx2-vnni", "avx2", "neon-i8mm", "neon-dotprod", "neon" or "portable"."""
    return str(_core.quant_linear_int16_path())


def quant_linear_path_for(activations: str) -> str:
    """The path the quantized kernel runs at the active ISA level with `activations` (int8,
    int16 or float rows: models/linear/quantized.py's ACTIVATIONS)."""
    paths = {"int8": quant_linear_path, "int16": quant_linear_int16_path,
             "float": quant_linear_float_path}  # fmt: skip
    return paths[activations]()


def quant_amx_available() -> bool:
    """quant_linear's amx_from_rows takes effect: the CPU has AMX-INT8 tiles Linux granted (or
    _core.linear_amx_emulation is on: tests). Same bits as the VNNI path at any threshold."""
    return bool(_core.quant_linear_amx_supported())


def quant_row_bytes(ggml_type: int, k: int) -> int:
    return int(_core.quant_row_bytes(ggml_type, k))


def quant_block_features(ggml_type: int) -> int:
    return int(_core.quant_block_features(ggml_type))


def pack_quant_weight(ggml_type: int, rows: np.ndarray, k: int) -> torch.Tensor:
    """rows: int64 [n] addresses of the GGUF rows (quant_row_bytes(ggml_type, k) bytes each,
    alive for the call) in packed column order, 0 for a zero column -> the packed weight."""
    require(ggml_type in QUANT_TYPES, "no quantized kernel for ggml type {}", ggml_type)
    require(k % quant_block_features(ggml_type) == 0, "k={} is not a multiple of {}", k,
             quant_block_features(ggml_type))  # fmt: skip
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    n = rows.shape[0]
    packed = torch.empty(int(_core.packed_quant_bytes(ggml_type, n, k)), dtype=torch.uint8)
    _core.pack_quant_weight(ggml_type, rows.ctypes.data, n, k, packed.data_ptr(),
                            torch.get_num_threads())  # fmt: skip
    return packed


def _check(
    out: torch.Tensor,
    x: torch.Tensor,
    packed: torch.Tensor,
    ggml_type: int,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None,
    gated_width: int,
    amx_from_rows: int = 0,
    float_activations: bool = False,
    int16_activations: bool = False,
) -> None:
    """x [m, k] bf16 or fp32 on the CPU; out [m, n] in x's dtype or fp32 ([m, gated_width] for a
    gated product); bias [n] and residual [m, n] in x's dtype; rows contiguous in the last dim."""
    require(x.dtype in _DTYPES and x.device.type == "cpu" and x.dim() == 2,
             "x must be a 2-D bfloat16 or float32 CPU tensor, got {} {} on {}", x.dtype,
             tuple(x.shape), x.device)  # fmt: skip
    require(out.dim() == 2 and out.shape[0] == x.shape[0] and out.device.type == "cpu"
             and out.dtype in (x.dtype, torch.float32),
             "out must be [{}, n] {} or float32 on cpu, got {} {}", x.shape[0], x.dtype,
             out.dtype, tuple(out.shape))  # fmt: skip
    require(ggml_type in QUANT_TYPES, "no quantized kernel for ggml type {}", ggml_type)
    require(amx_from_rows >= 0, "amx_from_rows must be >= 0 (0: never), got {}", amx_from_rows)
    require(not (float_activations and int16_activations),
             "float_activations and int16_activations exclude each other")  # fmt: skip
    m, k = x.shape
    n = int(_core.gated_rows(gated_width)) if gated_width > 0 else out.shape[1]
    require(gated_width <= 0 or out.shape[1] == gated_width,
             "a gated product writes [m, {}], out is {}", gated_width, tuple(out.shape))  # fmt: skip
    require(k % quant_block_features(ggml_type) == 0, "k={} is not a multiple of {}", k,
             quant_block_features(ggml_type))  # fmt: skip
    size = int(_core.packed_quant_bytes(ggml_type, n, k))
    require(packed.dtype == torch.uint8 and packed.numel() == size and packed.is_contiguous(),
             "packed must be {} contiguous uint8 bytes for [{}, {}], got {} {}", size, n, k,
             packed.dtype, packed.numel())  # fmt: skip
    require(x.stride(1) == 1 and out.stride(1) == 1,
             "x and out must be contiguous in their last dim")  # fmt: skip
    check_epilogue(x, bias, residual, m, n)


def quant_linear_eager(
    out: torch.Tensor,  # [m, n] (x's dtype or fp32), or [m, gated_width]
    x: torch.Tensor,  # [m, k] bf16 or fp32
    packed: torch.Tensor,  # pack_quant_weight's bytes
    ggml_type: int,
    bias: torch.Tensor | None,  # [n], x's dtype
    residual: torch.Tensor | None,  # [m, n], x's dtype, may be out itself
    gated_width: int,
    amx_from_rows: int = 0,  # calls of at least this many rows on AMX-INT8 tiles (0: never)
    float_activations: bool = False,  # x kept in fp32 (no int8 rounding; amx_from_rows unused)
    int16_activations: bool = False,  # x rounded to int16, not int8
) -> None:
    """quant_linear's body."""
    _check(out, x, packed, ggml_type, bias, residual, gated_width, amx_from_rows,
           float_activations, int16_activations)  # fmt: skip
    m, k = x.shape
    n = int(_core.gated_rows(gated_width)) if gated_width > 0 else out.shape[1]
    res_ptr, res_stride = (0, 0) if residual is None else (residual.data_ptr(), residual.stride(0))
    _core.quant_linear(ggml_type, x.data_ptr(), x.stride(0), x.dtype == torch.float32,
                       packed.data_ptr(), 0 if bias is None else bias.data_ptr(), res_ptr,
                       res_stride, out.data_ptr(), out.stride(0), out.dtype == torch.float32,
                       m, n, k, max(gated_width, 0), torch.get_num_threads(),
                       False, False, amx_from_rows, float_activations,
                       int16_activations)  # fmt: skip


quant_linear = NativeOp.declare("quant_linear", quant_linear_eager, _check, mutates=("out",))
