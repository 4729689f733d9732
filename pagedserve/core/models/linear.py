"""The model's linear layers: nn.Linear's parameters, a fused residual add, and on CPUs with
AVX512-BF16 the native bf16 kernel of pagedserve._core over a weight packed once at load.

    y = layer(x)                        x W^T (+ bias)
    h = layer(x, residual=h)            h + x W^T (+ bias), rounded once
    logits = layer(x, out_dtype=f32)    fp32 output (no bf16 rounding of the logits)
    mlp = gate_up(x)                    GateUpLinear: silu(x W_gate^T) * (x W_up^T)

Why our own kernel: at a small model's decode shapes (hidden 576) torch's bf16 matmul was
1.1-1.3x slower at 64 rows and 1.7-2.5x slower at one row (weights streamed for a single
request), and it cannot fuse the residual add or write fp32 logits; bench/linear.py measures
both side by side. Anywhere else (float32, float16, CUDA, a CPU without
AVX512-BF16) the torch expressions run, exactly as before, so the float32 oracle path is untouched.
"""

from __future__ import annotations

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
        """Repack the weight for the native kernel (CPU, bfloat16, AVX512-BF16) and drop the
        [out, in] copy; False (and nothing changes) where the kernel does not apply."""
        weight = self.weight
        if weight is None or self.packed is not None:
            return self.packed is not None
        if weight.device.type != "cpu" or weight.dtype != torch.bfloat16:
            return False
        if not native_linear_available():
            return False
        self.packed = self._pack(weight.detach().contiguous())  # a registered buffer: .to() sees it
        self.weight = None  # a tied embedding keeps its own reference to the tensor
        return True

    def _pack(self, weight: torch.Tensor) -> torch.Tensor:
        n, k = weight.shape
        packed = torch.empty(_core.packed_linear_elements(n, k), dtype=torch.bfloat16)
        _core.pack_linear_weight_bf16(weight.data_ptr(), n, k, packed.data_ptr(),
                                      torch.get_num_threads())  # fmt: skip
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
        packed = torch.empty(_core.packed_linear_elements(rows, k), dtype=torch.bfloat16)
        _core.pack_gated_weight_bf16(weight.data_ptr(), self.width, k, packed.data_ptr(),
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
    """out = x W^T (+ bias) (+ residual): the op's body, called straight by eager code."""
    _check(out, x, packed, bias, residual)
    m, n, k = x.shape[0], out.shape[1], x.shape[1]
    _core.linear_bf16(x.data_ptr(), x.stride(0), packed.data_ptr(),
                      0 if bias is None else bias.data_ptr(),
                      0 if residual is None else residual.data_ptr(),
                      0 if residual is None else residual.stride(0), out.data_ptr(),
                      out.stride(0), out.dtype == torch.float32, m, n, k, 0,
                      torch.get_num_threads())  # fmt: skip


packed_linear = torch.library.custom_op(
    "pagedserve::packed_linear", packed_linear_eager, mutates_args=("out",)
)
packed_linear.register_fake(_check)


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
    """out = silu(x W_gate^T) * (x W_up^T): the op's body, called straight by eager code."""
    _check_gated(out, x, packed)
    m, width, k = x.shape[0], out.shape[1], x.shape[1]
    _core.linear_bf16(x.data_ptr(), x.stride(0), packed.data_ptr(), 0, 0, 0, out.data_ptr(),
                      out.stride(0), False, m, _core.gated_rows(width), k, width,
                      torch.get_num_threads())  # fmt: skip


packed_gated_linear = torch.library.custom_op(
    "pagedserve::packed_gated_linear", packed_gated_linear_eager, mutates_args=("out",)
)
packed_gated_linear.register_fake(_check_gated)
