"""The packed linear kernels of pagedserve._core (x86-64 CPUs from ISA level avx2) as ops: bf16
weights, and their fp32 twin (a fixed order of summation over k whatever the rows:
batch-invariant). From level avx512_bf16 the bf16 kernel runs on AVX512-BF16 dot products (and
AMX tiles); at avx512 on AVX-512 FMAs, bf16 widened in registers; at avx2 and avx2_vnni on AVX2
FMAs, giving avx512's bits (native_linear_path()). The fp32 kernel gives the same bits at
every level, on AVX-512 from avx512.

    packed = pack_weight(weight)                    [n, k] -> the kernel's operand order
    packed_linear(out, x, packed, bias, residual)   out = x W^T (+ bias) (+ residual)
    packed = pack_gated_weight(weight, width)       gate/up [2 width, k], interleaved by 16
    packed_gated_linear(out, x, packed)             out = silu(x W_gate^T) * (x W_up^T)
    packed_linear(..., amx_from_rows=64)            bf16 calls of >= 64 rows on AMX tiles
    packed_linear(..., 64, tile_order=True)         ... fewer summed in the tiles' order

Both products are NativeOps (ops/base.py). models/linear/dense.py holds the layers that use them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from pagedserve.core.ops import native
from pagedserve.core.ops.base import NativeOp
from pagedserve.core.ops.native import require

_core = native.core


@dataclass(frozen=True)
class _Kernel:
    """The native entry points for one weight dtype."""

    elements: Callable[[int, int], int]
    pack: Callable[..., None]
    pack_gated: Callable[..., None]
    out_dtypes: tuple[torch.dtype, ...]  # what a plain product may write


_KERNELS = {
    torch.bfloat16: _Kernel(_core.packed_linear_elements, _core.pack_linear_weight_bf16,
                            _core.pack_gated_weight_bf16, (torch.bfloat16, torch.float32)),
    torch.float32: _Kernel(_core.packed_linear_elements_f32, _core.pack_linear_weight_f32,
                           _core.pack_gated_weight_f32, (torch.float32,)),
}  # fmt: skip
PACKABLE_DTYPES = tuple(_KERNELS)
"""The weight dtypes the native kernels take."""


def native_linear_available() -> bool:
    """The packed kernels run at the active ISA level (avx2 and up on x86-64; not at portable,
    nor on aarch64): else the layers keep torch's matmul."""
    return bool(_core.linear_bf16_supported())


def native_linear_path() -> str:
    """The kernels' path at the active ISA level: "avx512_bf16", "avx512", "avx2" or "none"."""
    return str(_core.linear_path())


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """A contiguous bf16 or fp32 [n, k] weight repacked for packed_linear."""
    n, k = weight.shape
    kernel = _KERNELS[weight.dtype]
    packed = torch.empty(kernel.elements(n, k), dtype=weight.dtype)
    kernel.pack(weight.data_ptr(), n, k, packed.data_ptr(), torch.get_num_threads())
    return packed


def pack_gated_weight(weight: torch.Tensor, width: int) -> torch.Tensor:
    """A contiguous bf16 or fp32 [2 width, k] gate/up weight (gate rows first) repacked for
    packed_gated_linear."""
    rows, k = _core.gated_rows(width), weight.shape[1]
    kernel = _KERNELS[weight.dtype]
    packed = torch.empty(kernel.elements(rows, k), dtype=weight.dtype)
    kernel.pack_gated(weight.data_ptr(), width, k, packed.data_ptr(),
                      torch.get_num_threads())  # fmt: skip
    return packed


def check_epilogue(
    x: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None, m: int, n: int
) -> None:
    """bias [n] contiguous and residual [m, n] (rows contiguous), both in x's dtype: what every
    linear kernel's epilogue adds (also checked by ops/linear_quant.py)."""
    if bias is not None:
        require(bias.shape == (n,) and bias.dtype == x.dtype and bias.is_contiguous(),
                 "bias must be [{}] contiguous {}", n, x.dtype)  # fmt: skip
    if residual is not None:
        require(residual.shape == (m, n) and residual.dtype == x.dtype
                 and residual.stride(1) == 1,
                 "residual must be [{}, {}] {}, got {} {}", m, n, x.dtype, residual.dtype,
                 tuple(residual.shape))  # fmt: skip


def _check_x(x: torch.Tensor, packed: torch.Tensor) -> None:
    require(x.dtype == packed.dtype and x.device.type == "cpu" and x.dim() == 2,
             "x must be a 2-D {} CPU tensor, got {} {} on {}", packed.dtype, x.dtype,
             tuple(x.shape), x.device)  # fmt: skip


def _check_amx(amx_from_rows: int) -> None:
    require(amx_from_rows >= 0, "amx_from_rows must be >= 0 (0: never), got {}", amx_from_rows)


def amx_available() -> bool:
    """packed_linear's amx_from_rows takes effect: bf16 products may run on AMX-BF16 tiles (the
    CPU has them and Linux granted them, or _core.linear_amx_emulation is on: tests)."""
    return bool(_core.linear_amx_supported())


def _packed_size(packed: torch.Tensor, n: int, k: int) -> int:
    require(packed.dtype in _KERNELS, "packed must be bfloat16 or float32, got {}", packed.dtype)
    return int(_KERNELS[packed.dtype].elements(n, k))


def _check(
    out: torch.Tensor,
    x: torch.Tensor,
    packed: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None,
    amx_from_rows: int = 0,
    tile_order: bool = False,
) -> None:
    """x [m, k] in packed's dtype (bf16 or fp32), CPU; out [m, n] bf16 or fp32 (fp32 only for
    an fp32 weight); rows contiguous in their last dim."""
    _check_x(x, packed)
    _check_amx(amx_from_rows)
    require(out.dim() == 2 and out.shape[0] == x.shape[0] and out.device.type == "cpu",
             "out must be [{}, n] on cpu, got {}", x.shape[0], tuple(out.shape))  # fmt: skip
    m, n, k = x.shape[0], out.shape[1], x.shape[1]
    size = _packed_size(packed, n, k)
    require(out.dtype in _KERNELS[packed.dtype].out_dtypes,
             "out must be one of {}, got {}", _KERNELS[packed.dtype].out_dtypes,
             out.dtype)  # fmt: skip
    require(packed.numel() == size, "packed holds {} elements, a packed [{}, {}] weight has {}",
             packed.numel(), n, k, size)  # fmt: skip
    require(x.stride(1) == 1 and out.stride(1) == 1 and packed.is_contiguous(),
             "x, out and packed must be contiguous in their last dim")  # fmt: skip
    check_epilogue(x, bias, residual, m, n)


def _run(
    out: torch.Tensor,
    x: torch.Tensor,
    packed: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None,
    n: int,
    gated_width: int,
    amx_from_rows: int,
    tile_order: bool,
) -> None:
    bias_ptr = 0 if bias is None else bias.data_ptr()
    res_ptr, res_stride = (0, 0) if residual is None else (residual.data_ptr(), residual.stride(0))
    m, k, threads = x.shape[0], x.shape[1], torch.get_num_threads()
    if packed.dtype == torch.float32:
        _core.linear_f32(x.data_ptr(), x.stride(0), packed.data_ptr(), bias_ptr, res_ptr,
                         res_stride, out.data_ptr(), out.stride(0), m, n, k, gated_width,
                         threads)  # fmt: skip
    else:
        _core.linear_bf16(x.data_ptr(), x.stride(0), packed.data_ptr(), bias_ptr, res_ptr,
                          res_stride, out.data_ptr(), out.stride(0), out.dtype == torch.float32,
                          m, n, k, gated_width, threads, amx_from_rows, tile_order)  # fmt: skip


def packed_linear_eager(
    out: torch.Tensor,  # [m, n] bf16 or fp32
    x: torch.Tensor,  # [m, k] bf16 or fp32 (the weight's dtype)
    packed: torch.Tensor,  # Linear.pack()'s buffer for an [n, k] weight
    bias: torch.Tensor | None,  # [n], x's dtype
    residual: torch.Tensor | None,  # [m, n], x's dtype, may be out itself
    amx_from_rows: int = 0,  # bf16: calls of at least this many rows on AMX tiles (0: never)
    tile_order: bool = False,  # bf16: fewer rows sum in the tiles' order (bit for bit them)
) -> None:
    """out = x W^T (+ bias) (+ residual): packed_linear's body."""
    _check(out, x, packed, bias, residual, amx_from_rows, tile_order)
    _run(out, x, packed, bias, residual, out.shape[1], 0, amx_from_rows, tile_order)


packed_linear = NativeOp.declare("packed_linear", packed_linear_eager, _check, mutates=("out",))


def _check_gated(
    out: torch.Tensor,
    x: torch.Tensor,
    packed: torch.Tensor,
    amx_from_rows: int = 0,
    tile_order: bool = False,
) -> None:
    """x [m, k] CPU in packed's dtype; out [m, width] likewise; packed: GateUpLinear's buffer."""
    _check_x(x, packed)
    _check_amx(amx_from_rows)
    require(out.dim() == 2 and out.shape[0] == x.shape[0] and out.device.type == "cpu"
             and out.dtype == x.dtype,
             "out must be [{}, width] {} on cpu, got {} {}", x.shape[0], x.dtype, out.dtype,
             tuple(out.shape))  # fmt: skip
    width, k = out.shape[1], x.shape[1]
    rows = int(_core.gated_rows(width)) if width > 0 else 0
    size = _packed_size(packed, rows, k) if rows else 0
    require(width > 0 and packed.numel() == size,
             "packed holds {} elements, a gated [2 x {}, {}] weight has {}", packed.numel(),
             width, k, size)  # fmt: skip
    require(x.stride(1) == 1 and out.stride(1) == 1 and packed.is_contiguous(),
             "x, out and packed must be contiguous in their last dim")  # fmt: skip


def packed_gated_linear_eager(
    out: torch.Tensor,  # [m, width], x's dtype
    x: torch.Tensor,  # [m, k] bf16 or fp32
    packed: torch.Tensor,  # GateUpLinear.pack()'s buffer
    amx_from_rows: int = 0,  # as packed_linear's
    tile_order: bool = False,
) -> None:
    """out = silu(x W_gate^T) * (x W_up^T): packed_gated_linear's body."""
    _check_gated(out, x, packed, amx_from_rows, tile_order)
    width = out.shape[1]
    _run(out, x, packed, None, None, _core.gated_rows(width), width, amx_from_rows, tile_order)


packed_gated_linear = NativeOp.declare(
    "packed_gated_linear", packed_gated_linear_eager, _check_gated, mutates=("out",)
)
