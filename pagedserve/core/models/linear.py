"""The model's linear layers: nn.Linear's parameters, a fused residual add, and on CPUs with
AVX512-BF16 the native bf16 kernel of pagedserve._core over a weight packed once at load.

    y = layer(x)                        x W^T (+ bias)
    h = layer(x, residual=h)            h + x W^T (+ bias), rounded once
    logits = layer(x, out_dtype=f32)    fp32 output (no bf16 rounding of the logits)

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
from pagedserve.core.native import require

_core = native.core


def native_linear_available() -> bool:
    return bool(_core.linear_bf16_supported())


class Linear(nn.Module):
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
        n, k = weight.shape
        packed = torch.empty(_core.packed_linear_elements(n, k), dtype=torch.bfloat16)
        source = weight.detach().contiguous()
        _core.pack_linear_weight_bf16(source.data_ptr(), n, k, packed.data_ptr(),
                                      torch.get_num_threads())  # fmt: skip
        self.packed = packed  # a registered buffer: .to() and .buffers() see it
        self.weight = None  # a tied embedding keeps its own reference to the tensor
        return True

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
        # The packed size pins k only to a pair (k and k + 1 pack alike): check it here.
        require(x.shape[-1] == self.in_features, "x has {} features, the layer {}",
                 x.shape[-1], self.in_features)  # fmt: skip
        if x.dim() == 2 and x.stride(1) != 1:
            x = x.contiguous()
        if residual is not None and residual.dim() == 2 and residual.stride(1) != 1:
            residual = residual.contiguous()
        out = torch.empty((x.shape[0], self.out_features), dtype=out_dtype, device=x.device)
        # Eager code calls the op's body straight (the dispatcher costs ~100 us a call, several
        # calls per layer and step); traced code needs the registered op.
        op = packed_linear if torch.compiler.is_compiling() else packed_linear_eager
        op(out, x, self.packed, self.bias, residual)
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
                      out.stride(0), out.dtype == torch.float32, m, n, k,
                      torch.get_num_threads())  # fmt: skip


packed_linear = torch.library.custom_op(
    "pagedserve::packed_linear", packed_linear_eager, mutates_args=("out",)
)
packed_linear.register_fake(_check)
