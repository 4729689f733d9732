"""The model's linear layers: nn.Linear's parameters, a fused residual add, and on x86-64 CPUs
from ISA level avx2 the native bf16 (and fp32) kernel of pagedserve._core over a weight packed
once at load (AVX512-BF16 dot products where the CPU has them, else AVX2 FMAs:
ops/linear.py's native_linear_path()).

    y = layer(x)                        x W^T (+ bias)
    h = layer(x, residual=h)            h + x W^T (+ bias), rounded once
    logits = layer(x, out_dtype=f32)    fp32 output (no bf16 rounding of the logits)
    mlp = gate_up(x)                    GateUpLinear: silu(x W_gate^T) * (x W_up^T)
                                        (or gelu_tanh(...) * ..., GeGLU, when so built)

Why our own kernel: at a small model's decode shapes (hidden 576) torch's bf16 matmul was
slower, most of all at one row (weights streamed for a single request), and it cannot fuse the
residual add or write fp32 logits; bench/kernels/linear.py measures both side by side (figures in
bench/RESULTS.md). Float32 weights on such a CPU take the kernel's fp32 twin: torch's fp32
matmul picks its kernel by the row count, so a row's logits changed with the batch (issue 16),
while the native kernels sum every output over k in order whatever the rows. Anywhere else
(float16, CUDA, a CPU below AVX2, aarch64) the torch expressions run, and are not batch-invariant.

A packed layer may also keep its [out, in] weight and take torch's matmul from `torch_from`
rows on (route(); models/linear/dispatch.py measures where that pays, e.g. oneDNN's AMX tiles on
Intel CPUs for batched products): fewer rows stay on the native kernel. On a CPU with AMX-BF16
the native bf16 kernel itself runs calls of at least `amx_from` rows on AMX tiles (use_amx()).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pagedserve.core.lora.weights import LoraBatch, LoraWeights, add_lora, gated_with_lora
from pagedserve.core.ops import layer_ops
from pagedserve.core.ops.linear import (
    PACKABLE_DTYPES,
    native_linear_available,
    pack_gated_weight,
    pack_weight,
    packed_gated_linear,
    packed_linear,
)
from pagedserve.core.ops.native import core, require


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
        self.torch_from: int | None = None
        """Rows from which a packed layer runs torch's matmul on its kept weight (route())."""
        self.amx_from = 0
        """Rows from which the native bf16 kernel runs on AMX tiles (0: never; use_amx())."""
        self.tile_order = False
        """Fewer rows sum in the tiles' order (use_amx())."""
        self.lora: LoraWeights | None = None
        """The adapters' stacks beside this layer (LlamaForCausalLM.enable_lora())."""

    def weight_bytes(self) -> int:
        """Bytes one product reads from the weights (the packed copy once packed)."""
        tensors = [self.packed if self.packed is not None else self.weight, self.bias]
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)

    def extra_repr(self) -> str:
        kind = f"packed {self.packed.dtype}" if self.packed is not None else "torch"
        if self.packed is not None and self.torch_from is not None:
            kind += f", torch from {self.torch_from} rows"
        if self.packed is not None and self.amx_from:
            kind += f", amx from {self.amx_from} rows" + (" (tile order below)" * self.tile_order)
        return f"{self.in_features} -> {self.out_features}, bias={self.bias is not None}, {kind}"

    def route(self, torch_from: int | None) -> None:
        """Run torch's matmul from `torch_from` rows on (None: the native kernel at every row
        count); needs the weight kept by pack(keep_weight=True)."""
        require(torch_from is None or (self.weight is not None and torch_from >= 1),
                 "route: torch_from {} needs the weight kept at pack()", torch_from)  # fmt: skip
        self.torch_from = torch_from

    def use_amx(self, from_rows: int, tile_order: bool = False) -> None:
        """Native bf16 products of at least `from_rows` rows run on AMX tiles where the CPU
        grants them (ops/linear.py's packed_linear; 0: never, 1: every call); with tile_order
        fewer rows sum in the tiles' order."""
        require(from_rows >= 0, "use_amx: from_rows must be >= 0, got {}", from_rows)
        self.amx_from, self.tile_order = from_rows, tile_order

    def _runs_native(self, x: torch.Tensor) -> bool:
        return self.packed is not None and (self.torch_from is None or x.shape[0] < self.torch_from)

    def pack(self, keep_weight: bool = False) -> bool:
        """Repack the weight for the native kernel (CPU, bfloat16 or float32, ISA level avx2 and
        up) and drop the [out, in] copy unless keep_weight (for route()); False (and nothing
        changes) where the kernel does not apply."""
        weight = self.weight
        if weight is None or self.packed is not None:
            return self.packed is not None
        if weight.device.type != "cpu" or weight.dtype not in PACKABLE_DTYPES:
            return False
        if not native_linear_available():
            return False
        self.packed = self._pack(weight.detach().contiguous())  # a registered buffer: .to() sees it
        if not keep_weight:
            self.weight = None  # a tied embedding keeps its own reference to the tensor
        return True

    def _pack(self, weight: torch.Tensor) -> torch.Tensor:
        return pack_weight(weight)

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
        lora: LoraBatch | None = None,  # the step's adapter rows (None: base rows only)
    ) -> torch.Tensor:  # [m, out_features]
        if self._runs_native(x):
            return add_lora(self._native(x, residual, out_dtype or x.dtype), x, self.lora, lora)
        assert self.weight is not None
        if residual is not None and self.bias is None:
            y = torch.addmm(residual, x, self.weight.t())  # one op for product and add
        else:
            y = F.linear(x, self.weight, self.bias)
            if residual is not None:
                y = y + residual
        return add_lora(y if out_dtype is None else y.to(out_dtype), x, self.lora, lora)

    def _native(
        self, x: torch.Tensor, residual: torch.Tensor | None, out_dtype: torch.dtype
    ) -> torch.Tensor:
        assert self.packed is not None
        x = self._check_features(x)
        if residual is not None and residual.dim() == 2 and residual.stride(1) != 1:
            residual = residual.contiguous()
        out = torch.empty((x.shape[0], self.out_features), dtype=out_dtype, device=x.device)
        packed_linear(out, x, self.packed, self.bias, residual, self.amx_from, self.tile_order)
        return out


class GateUpLinear(PackableLinear):
    """SwiGLU's gate and up projections in one layer: forward(x) = silu(x W_gate^T) * (x W_up^T),
    [m, width], from the [2 width, in_features] weight the loaders fuse (gate rows first).

    Packed, the weight's rows are interleaved by 16 so that each kernel tile holds 16 gate
    columns next to their 16 up columns, and SiLU-and-mul runs in the kernel's epilogue on the
    fp32 accumulators: the [m, 2 width] product never reaches memory and is not rounded to bf16
    on the way. Elsewhere it is the torch product followed by layer_ops.silu_and_mul, as before.
    """

    def __init__(self, in_features: int, width: int, activation: str = "silu") -> None:
        super().__init__(in_features, 2 * width)
        self.width, self.activation = width, activation

    def _pack(self, weight: torch.Tensor) -> torch.Tensor:
        if self.activation != "silu":  # the epilogue is SiLU's: a plain product, then torch
            return pack_weight(weight)
        return pack_gated_weight(weight, self.width)

    def forward(
        self, x: torch.Tensor, lora: LoraBatch | None = None
    ) -> torch.Tensor:  # [m, in_features] -> [m, width]
        if lora is not None and self.lora is not None:  # the adapters add before the activation
            return gated_with_lora(x, self.lora, lora, self._gated, self._pre_activation,
                                   self._activation)  # fmt: skip
        return self._gated(x)

    def _activation(self, gate_up: torch.Tensor) -> torch.Tensor:
        return gated_activation(gate_up, self.width, self.activation)

    def _gated(self, x: torch.Tensor) -> torch.Tensor:  # [m, in_features] -> [m, width]
        if self.activation == "gelu_tanh":
            gate_up = self._plain_product(x)  # GeGLU: gelu_tanh(gate) * up
            return F.gelu(gate_up[:, : self.width], approximate="tanh") * gate_up[:, self.width :]
        if not self._runs_native(x):
            assert self.weight is not None
            return layer_ops.silu_and_mul(F.linear(x, self.weight))
        x = self._check_features(x)
        out = torch.empty((x.shape[0], self.width), dtype=x.dtype, device=x.device)
        packed_gated_linear(out, x, self.packed, self.amx_from, self.tile_order)
        return out

    def _pre_activation(self, x: torch.Tensor) -> torch.Tensor:  # [m, in] -> [m, 2 width]
        """gate | up before the activation, also from a weight packed for the SiLU epilogue."""
        if self.activation != "silu" or not self._runs_native(x):
            return self._plain_product(x)
        x = self._check_features(x)
        rows = int(core.gated_rows(self.width))
        out = torch.empty((x.shape[0], rows), dtype=x.dtype, device=x.device)
        packed_linear(out, x, self.packed, None, None, self.amx_from, self.tile_order)
        return deinterleave_gated(out, self.width)

    def _plain_product(self, x: torch.Tensor) -> torch.Tensor:  # [m, in] -> [m, 2 width]
        if not self._runs_native(x):
            assert self.weight is not None
            return F.linear(x, self.weight)
        x = self._check_features(x)
        out = torch.empty((x.shape[0], 2 * self.width), dtype=x.dtype, device=x.device)
        packed_linear(out, x, self.packed, None, None, self.amx_from, self.tile_order)
        return out


def deinterleave_gated(product: torch.Tensor, width: int) -> torch.Tensor:
    """[m, gated_rows(width)] columns of a weight packed for the SiLU epilogue (16 gate columns,
    then their 16 up columns: core/linear.hpp's kLinearGateCols) -> [m, 2 width], gate | up."""
    m = product.shape[0]
    blocks = product.view(m, -1, 2, 16).transpose(1, 2).reshape(m, 2, -1)
    return blocks[:, :, :width].reshape(m, 2 * width)


def gated_activation(gate_up: torch.Tensor, width: int, activation: str) -> torch.Tensor:
    """act(gate) * up of [m, 2 width] gate | up (SiLU, or GeGLU's gelu_tanh)."""
    if activation == "gelu_tanh":
        return F.gelu(gate_up[:, :width], approximate="tanh") * gate_up[:, width:]
    return layer_ops.silu_and_mul(gate_up)
