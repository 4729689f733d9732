"""The packed bf16 linear kernels of pagedserve._core (CPUs with AVX512-BF16) as ops.

    packed = pack_weight(weight)                    [n, k] -> the kernel's operand order
    packed_linear(out, x, packed, bias, residual)   out = x W^T (+ bias) (+ residual)
    packed = pack_gated_weight(weight, width)       gate/up [2 width, k], interleaved by 16
    packed_gated_linear(out, x, packed)             out = silu(x W_gate^T) * (x W_up^T)

Both products are NativeOps (ops/base.py). models/linear.py holds the layers that use them.
"""

from __future__ import annotations

import torch

from pagedserve.core.ops import native
from pagedserve.core.ops.base import NativeOp
from pagedserve.core.ops.native import require

_core = native.core


def native_linear_available() -> bool:
    return bool(_core.linear_bf16_supported())


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """A contiguous bf16 [n, k] weight repacked for packed_linear."""
    n, k = weight.shape
    packed = torch.empty(_core.packed_linear_elements(n, k), dtype=torch.bfloat16)
    _core.pack_linear_weight_bf16(weight.data_ptr(), n, k, packed.data_ptr(),
                                  torch.get_num_threads())  # fmt: skip
    return packed


def pack_gated_weight(weight: torch.Tensor, width: int) -> torch.Tensor:
    """A contiguous bf16 [2 width, k] gate/up weight (gate rows first) repacked for
    packed_gated_linear."""
    rows, k = _core.gated_rows(width), weight.shape[1]
    packed = torch.empty(_core.packed_linear_elements(rows, k), dtype=torch.bfloat16)
    _core.pack_gated_weight_bf16(weight.data_ptr(), width, k, packed.data_ptr(),
                                 torch.get_num_threads())  # fmt: skip
    return packed


def _check(
    out: torch.Tensor,
    x: torch.Tensor,
    packed: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None,
) -> None:
    """x [m, k] bf16 CPU; out [m, n] bf16 or fp32; rows contiguous in their last dim."""
    require(x.dtype == torch.bfloat16 and x.device.type == "cpu" and x.dim() == 2,
             "x must be a 2-D bfloat16 CPU tensor, got {} {} on {}", x.dtype,
             tuple(x.shape), x.device)  # fmt: skip
    require(out.dim() == 2 and out.shape[0] == x.shape[0] and out.device.type == "cpu",
             "out must be [{}, n] on cpu, got {}", x.shape[0], tuple(out.shape))  # fmt: skip
    m, n, k = x.shape[0], out.shape[1], x.shape[1]
    require(out.dtype in (torch.bfloat16, torch.float32),
             "out must be bfloat16 or float32, got {}", out.dtype)  # fmt: skip
    require(packed.dtype == torch.bfloat16 and packed.numel() == _packed_size(n, k),
             "packed holds {} elements, a packed [{}, {}] weight has {}", packed.numel(), n, k,
             _packed_size(n, k))  # fmt: skip
    require(x.stride(1) == 1 and out.stride(1) == 1 and packed.is_contiguous(),
             "x, out and packed must be contiguous in their last dim")  # fmt: skip
    if bias is not None:
        require(bias.shape == (n,) and bias.dtype == torch.bfloat16 and bias.is_contiguous(),
                 "bias must be [{}] contiguous bfloat16", n)  # fmt: skip
    if residual is not None:
        require(residual.shape == (m, n) and residual.dtype == torch.bfloat16
                 and residual.stride(1) == 1,
                 "residual must be [{}, {}] bfloat16, got {} {}", m, n, residual.dtype,
                 tuple(residual.shape))  # fmt: skip


def _packed_size(n: int, k: int) -> int:
    return int(_core.packed_linear_elements(n, k))


def packed_linear_eager(
    out: torch.Tensor,  # [m, n] bf16 or fp32
    x: torch.Tensor,  # [m, k] bf16
    packed: torch.Tensor,  # Linear.pack()'s buffer for an [n, k] weight
    bias: torch.Tensor | None,  # [n] bf16
    residual: torch.Tensor | None,  # [m, n] bf16, may be out itself
) -> None:
    """out = x W^T (+ bias) (+ residual): packed_linear's body."""
    _check(out, x, packed, bias, residual)
    m, n, k = x.shape[0], out.shape[1], x.shape[1]
    _core.linear_bf16(x.data_ptr(), x.stride(0), packed.data_ptr(),
                      0 if bias is None else bias.data_ptr(),
                      0 if residual is None else residual.data_ptr(),
                      0 if residual is None else residual.stride(0), out.data_ptr(),
                      out.stride(0), out.dtype == torch.float32, m, n, k, 0,
                      torch.get_num_threads())  # fmt: skip


packed_linear = NativeOp.declare("packed_linear", packed_linear_eager, _check, mutates=("out",))


def _check_gated(out: torch.Tensor, x: torch.Tensor, packed: torch.Tensor) -> None:
    """x [m, k] bf16 CPU; out [m, width] bf16; packed: GateUpLinear's buffer for that width."""
    require(x.dtype == torch.bfloat16 and x.device.type == "cpu" and x.dim() == 2,
             "x must be a 2-D bfloat16 CPU tensor, got {} {} on {}", x.dtype,
             tuple(x.shape), x.device)  # fmt: skip
    require(out.dim() == 2 and out.shape[0] == x.shape[0] and out.device.type == "cpu"
             and out.dtype == torch.bfloat16,
             "out must be [{}, width] bfloat16 on cpu, got {} {}", x.shape[0], out.dtype,
             tuple(out.shape))  # fmt: skip
    width, k = out.shape[1], x.shape[1]
    rows = int(_core.gated_rows(width)) if width > 0 else 0
    require(width > 0 and packed.dtype == torch.bfloat16
             and packed.numel() == _packed_size(rows, k),
             "packed holds {} elements, a gated [2 x {}, {}] weight has {}", packed.numel(),
             width, k, _packed_size(rows, k) if rows else 0)  # fmt: skip
    require(x.stride(1) == 1 and out.stride(1) == 1 and packed.is_contiguous(),
             "x, out and packed must be contiguous in their last dim")  # fmt: skip


def packed_gated_linear_eager(
    out: torch.Tensor,  # [m, width] bf16
    x: torch.Tensor,  # [m, k] bf16
    packed: torch.Tensor,  # GateUpLinear.pack()'s buffer
) -> None:
    """out = silu(x W_gate^T) * (x W_up^T): packed_gated_linear's body."""
    _check_gated(out, x, packed)
    m, width, k = x.shape[0], out.shape[1], x.shape[1]
    _core.linear_bf16(x.data_ptr(), x.stride(0), packed.data_ptr(), 0, 0, 0, out.data_ptr(),
                      out.stride(0), False, m, _core.gated_rows(width), k, width,
                      torch.get_num_threads())  # fmt: skip


packed_gated_linear = NativeOp.declare(
    "packed_gated_linear", packed_gated_linear_eager, _check_gated, mutates=("out",)
)
