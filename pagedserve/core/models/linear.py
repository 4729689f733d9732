"""The model's linear layers: nn.Linear's parameters, a fused residual add, and on CPUs with
AVX512-BF16 the native bf16 (and fp32) kernel of pagedserve._core over a weight packed once at
load.

    y = layer(x)                        x W^T (+ bias)
    h = layer(x, residual=h)            h + x W^T (+ bias), rounded once
    logits = layer(x, out_dtype=f32)    fp32 output (no bf16 rounding of the logits)
    mlp = gate_up(x)                    GateUpLinear: silu(x W_gate^T) * (x W_up^T)

Why our own kernel: at a small model's decode shapes (hidden 576) torch's bf16 matmul was
1.1-1.3x slower at 64 rows and 1.7-2.5x slower at one row (weights streamed for a single
request), and it cannot fuse the residual add or write fp32 logits; bench/linear.py measures
both side by side. Float32 weights on such a CPU take the kernel's fp32 twin: torch's fp32
matmul picks its kernel by the row count, so a row's logits changed with the batch (issue 16),
while the native kernels sum every output over k in order whatever the rows. Anywhere else
(float16, CUDA, a CPU without AVX512-BF16) the torch expressions run, and are not batch-invariant.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from pagedserve.core import native
from pagedserve.core.models import layer_ops
from pagedserve.core.native import require

_core = native.core


def native_linear_available() -> bool:
    return bool(_core.linear_bf16_supported())


class PackableLinear(nn.Module):
    """nn.Linear's parameters, and pack() onto the native kernel where it applies; the two
    layers below add their forward."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight: nn.Parameter | None = nn.Parameter(torch.empty(out_features, in_features))
        self.bias: nn.Parameter | None = nn.Parameter(torch.empty(out_features)) if bias else None
        self.packed: torch.Tensor | None
        self.register_buffer("packed", None, persistent=False)  # set by pack()

    def weight_bytes(self) -> int:
        """Bytes one product reads from the weights (the packed copy once packed)."""
        tensors = [self.packed if self.packed is not None else self.weight, self.bias]
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)

    def extra_repr(self) -> str:
        kind = "packed bf16" if self.packed is not None else "torch"
        return f"{self.in_features} -> {self.out_features}, bias={self.bias is not None}, {kind}"

    def pack(self) -> bool:
        """Repack the weight for the native kernel (CPU, bfloat16 or float32, AVX512-BF16) and
        drop the [out, in] copy; False (and nothing changes) where the kernel does not apply."""
        weight = self.weight
        if weight is None or self.packed is not None:
            return self.packed is not None
        if weight.device.type != "cpu" or weight.dtype not in _KERNELS:
            return False
        if not native_linear_available():
            return False
        self.packed = self._pack(weight.detach().contiguous())  # a registered buffer: .to() sees it
        self.weight = None  # a tied embedding keeps its own reference to the tensor
        return True

    def _pack(self, weight: torch.Tensor) -> torch.Tensor:
        n, k = weight.shape
        kernel = _KERNELS[weight.dtype]
        packed = torch.empty(kernel.elements(n, k), dtype=weight.dtype)
        kernel.pack(weight.data_ptr(), n, k, packed.data_ptr(), torch.get_num_threads())
        return packed

    def _check_features(self, x: torch.Tensor) -> torch.Tensor:
        """x with rows contiguous in their last dim, after checking its width (the packed size
        pins k only to a pair: k and k + 1 pack alike)."""
        require(x.shape[-1] == self.in_features, "x has {} features, the layer {}",
                 x.shape[-1], self.in_features)  # fmt: skip
        return x.contiguous() if x.dim() == 2 and x.stride(1) != 1 else x


class Linear(PackableLinear):
    def forward(
        self,
        x: torch.Tensor,  # [m, in_features]
        residual: torch.Tensor | None = None,  # [m, out_features], x's dtype
        *,
        out_dtype: torch.dtype | None = None,
    ) -> torch.Tensor:  # [m, out_features]
        if self.packed is not None:
            return self._native(x, residual, out_dtype or x.dtype)
        assert self.weight is not None
        if residual is not None and self.bias is None:
            y = torch.addmm(residual, x, self.weight.t())  # one op for product and add
        else:
            y = F.linear(x, self.weight, self.bias)
            if residual is not None:
                y = y + residual
        return y if out_dtype is None else y.to(out_dtype)

    def _native(
        self, x: torch.Tensor, residual: torch.Tensor | None, out_dtype: torch.dtype
    ) -> torch.Tensor:
        assert self.packed is not None
        x = self._check_features(x)
        if residual is not None and residual.dim() == 2 and residual.stride(1) != 1:
            residual = residual.contiguous()
        out = torch.empty((x.shape[0], self.out_features), dtype=out_dtype, device=x.device)
        # Eager code calls the op's body straight (the dispatcher costs ~100 us a call, several
        # calls per layer and step); traced code needs the registered op.
        op = packed_linear if torch.compiler.is_compiling() else packed_linear_eager
        op(out, x, self.packed, self.bias, residual)
        return out


class GateUpLinear(PackableLinear):
    """SwiGLU's gate and up projections in one layer: forward(x) = silu(x W_gate^T) * (x W_up^T),
    [m, width], from the [2 width, in_features] weight the loaders fuse (gate rows first).

    Packed, the weight's rows are interleaved by 16 so that each kernel tile holds 16 gate
    columns next to their 16 up columns, and SiLU-and-mul runs in the kernel's epilogue on the
    fp32 accumulators: the [m, 2 width] product never reaches memory and is not rounded to bf16
    on the way. Elsewhere it is the torch product followed by layer_ops.silu_and_mul, as before.
    """

    def __init__(self, in_features: int, width: int) -> None:
        super().__init__(in_features, 2 * width)
        self.width = width

    def _pack(self, weight: torch.Tensor) -> torch.Tensor:
        rows, k = _core.gated_rows(self.width), weight.shape[1]
        kernel = _KERNELS[weight.dtype]
        packed = torch.empty(kernel.elements(rows, k), dtype=weight.dtype)
        kernel.pack_gated(weight.data_ptr(), self.width, k, packed.data_ptr(),
                          torch.get_num_threads())  # fmt: skip
        return packed

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [m, in_features] -> [m, width]
        if self.packed is None:
            assert self.weight is not None
            return layer_ops.silu_and_mul(F.linear(x, self.weight))
        x = self._check_features(x)
        out = torch.empty((x.shape[0], self.width), dtype=x.dtype, device=x.device)
        op = packed_gated_linear if torch.compiler.is_compiling() else packed_gated_linear_eager
        op(out, x, self.packed)
        return out


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


def _check_x(x: torch.Tensor, packed: torch.Tensor) -> None:
    require(x.dtype == packed.dtype and x.device.type == "cpu" and x.dim() == 2,
             "x must be a 2-D {} CPU tensor, got {} {} on {}", packed.dtype, x.dtype,
             tuple(x.shape), x.device)  # fmt: skip


def _packed_size(packed: torch.Tensor, n: int, k: int) -> int:
    require(packed.dtype in _KERNELS, "packed must be bfloat16 or float32, got {}", packed.dtype)
    return int(_KERNELS[packed.dtype].elements(n, k))


def _check(
    out: torch.Tensor,
    x: torch.Tensor,
    packed: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None,
) -> None:
    """x [m, k] in packed's dtype (bf16 or fp32), CPU; out [m, n] bf16 or fp32 (fp32 only for
    an fp32 weight); rows contiguous in their last dim."""
    _check_x(x, packed)
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
    if bias is not None:
        require(bias.shape == (n,) and bias.dtype == x.dtype and bias.is_contiguous(),
                 "bias must be [{}] contiguous {}", n, x.dtype)  # fmt: skip
    if residual is not None:
        require(residual.shape == (m, n) and residual.dtype == x.dtype
                 and residual.stride(1) == 1,
                 "residual must be [{}, {}] {}, got {} {}", m, n, x.dtype, residual.dtype,
                 tuple(residual.shape))  # fmt: skip


def _run(
    out: torch.Tensor,
    x: torch.Tensor,
    packed: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None,
    n: int,
    gated_width: int,
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
                          m, n, k, gated_width, threads)  # fmt: skip


def packed_linear_eager(
    out: torch.Tensor,  # [m, n] bf16 or fp32
    x: torch.Tensor,  # [m, k] bf16 or fp32 (the weight's dtype)
    packed: torch.Tensor,  # Linear.pack()'s buffer for an [n, k] weight
    bias: torch.Tensor | None,  # [n], x's dtype
    residual: torch.Tensor | None,  # [m, n], x's dtype, may be out itself
) -> None:
    """out = x W^T (+ bias) (+ residual): the op's body, called straight by eager code."""
    _check(out, x, packed, bias, residual)
    _run(out, x, packed, bias, residual, out.shape[1], 0)


packed_linear = torch.library.custom_op(
    "pagedserve::packed_linear", packed_linear_eager, mutates_args=("out",)
)
packed_linear.register_fake(_check)


def _check_gated(out: torch.Tensor, x: torch.Tensor, packed: torch.Tensor) -> None:
    """x [m, k] CPU in packed's dtype; out [m, width] likewise; packed: GateUpLinear's buffer."""
    _check_x(x, packed)
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
) -> None:
    """out = silu(x W_gate^T) * (x W_up^T): the op's body, called straight by eager code."""
    _check_gated(out, x, packed)
    width = out.shape[1]
    _run(out, x, packed, None, None, _core.gated_rows(width), width)


packed_gated_linear = torch.library.custom_op(
    "pagedserve::packed_gated_linear", packed_gated_linear_eager, mutates_args=("out",)
)
packed_gated_linear.register_fake(_check_gated)
