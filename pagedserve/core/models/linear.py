"""The model's linear layers: nn.Linear's parameters, a fused residual add, and on CPUs with
AVX512-BF16 the native bf16 kernel of pagedserve._core over a weight packed once at load.

    y = layer(x)                        x W^T (+ bias)
    h = layer(x, residual=h)            h + x W^T (+ bias), rounded once
    logits = layer(x, out_dtype=f32)    fp32 output (no bf16 rounding of the logits)

Why our own kernel: at a small model's decode shapes (tens of rows, hidden 576) torch's bf16
matmul neither splits well across 2 threads nor streams weights at memory speed for one row;
bench/linear.py measures both side by side. Anywhere else (float32, float16, CUDA, a CPU without
AVX512-BF16) the torch expressions run, exactly as before, so the float32 oracle path is untouched.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pagedserve.core import native

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
        m, n = x.shape[0], self.out_features
        if x.dtype != torch.bfloat16 or x.device.type != "cpu" or x.dim() != 2:
            raise ValueError(f"x must be a [m, {self.in_features}] bfloat16 CPU tensor")
        if x.shape[1] != self.in_features:
            raise ValueError(f"x has {x.shape[1]} features, the layer {self.in_features}")
        if out_dtype not in (torch.bfloat16, torch.float32):
            raise ValueError(f"out_dtype must be bfloat16 or float32, got {out_dtype}")
        if x.stride(1) != 1:
            x = x.contiguous()
        out = torch.empty((m, n), dtype=out_dtype)
        res_ptr, res_stride = 0, 0
        if residual is not None:
            if residual.shape != (m, n) or residual.dtype != torch.bfloat16:
                raise ValueError(f"residual must be [{m}, {n}] bfloat16, got {residual.shape}")
            if residual.stride(1) != 1:
                residual = residual.contiguous()
            res_ptr, res_stride = residual.data_ptr(), residual.stride(0)
        assert self.packed is not None
        bias = 0 if self.bias is None else self.bias.data_ptr()
        _core.linear_bf16(x.data_ptr(), x.stride(0), self.packed.data_ptr(), bias, res_ptr,
                          res_stride, out.data_ptr(), n, out_dtype == torch.float32, m, n,
                          self.in_features, torch.get_num_threads())  # fmt: skip
        return out
