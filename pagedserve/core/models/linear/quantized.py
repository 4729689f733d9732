"""GGUF quantized weights kept quantized (issue 12, `--quantization auto`).

    plan = plan_quantized(reader, arch, dtype=..., device=...)   which linears stay quantized
    iter_gguf_weights(reader, arch, skip=plan.kept)               the rest, dequantized
    plan.install(model)                                           swap in the quantized layers

Each linear whose GGUF tensors are Q4_0, Q4_1, Q8_0, Q4_K, Q5_K or Q6_K becomes a
QuantizedLinear (or QuantizedGateUpLinear for SwiGLU's fused gate/up) over the native kernel of
ops/linear_quant.py: the blocks are repacked once, straight from the memory-mapped file (a row
table concatenates q/k/v, undoes llama.cpp's rotary row order and interleaves gate/up rows by
16), and never dequantized. Fused parts of different types (a Q4_K_M file's Q6_K attn_v) run
as consecutive column segments. Other quantized types are dequantized as before, and the
start-up log names them. A quantized token embedding stays in its blocks too where no dense
table is needed (the LM head is kept quantized, or is a tensor of its own): its lookups
dequantize the rows they read (models/quantized_embedding.py), out of the LM head's tiles where
the head is the same Q8_0 tensor (one copy for both).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader
from torch import nn

from pagedserve.core.lora.weights import LoraBatch, LoraWeights, add_lora, gated_with_lora
from pagedserve.core.models.arch import ArchConfig
from pagedserve.core.models.linear.dense import deinterleave_gated, gated_activation
from pagedserve.core.models.loader_gguf import PERMUTED_ARCHITECTURES, unpermute_rotary
from pagedserve.core.models.quantized_embedding import QuantizedEmbedding, TiedQ8Embedding
from pagedserve.core.ops.linear_quant import (
    QUANT_TYPES,
    pack_quant_weight,
    quant_linear,
    quant_linear_path,
)
from pagedserve.core.ops.native import core, require

logger = logging.getLogger(__name__)

QUANTIZATION_MODES = ("auto", "none")
_PLAIN = frozenset({GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16})


@dataclass(frozen=True)
class Segment:
    """Consecutive output columns of one quantized layer that share a GGUF type."""

    ggml_type: int
    width: int
    packed: torch.Tensor


def _use_amx(layer: QuantizedLinear | QuantizedGateUpLinear, from_rows: int) -> None:
    """Products of at least `from_rows` rows on AMX-INT8 tiles where the CPU grants them: the
    VNNI path's bits, so only speed decides (models/linear/dispatch.py; 0: never)."""
    require(from_rows >= 0, "use_amx: from_rows must be >= 0, got {}", from_rows)
    layer.amx_from = from_rows


ACTIVATIONS = ("int8", "int16", "float")
"""What the kernels multiply the blocks with (ops/linear_quant.py): x rounded to int8 per 32
features (llama.cpp's), to int16 (int16_activations), or kept in fp32 (float_activations)."""


def _use_activations(layer: QuantizedLinear | QuantizedGateUpLinear, kind: str) -> None:
    """This layer's products take x as `kind` (ACTIVATIONS): int16 and float keep what a
    model as small as SmolLM2-135M loses to int8. Settable after load; each forward passes it on."""
    require(kind in ACTIVATIONS, "activations must be one of {}, got {!r}", ACTIVATIONS, kind)
    layer.float_activations = kind == "float"
    layer.int16_activations = kind == "int16"


class QuantizedLinear(nn.Module):
    """Linear's forward (x [m, in] -> [m, out], fused residual, fp32 logits) over packed GGUF
    blocks, one native call per segment of columns."""

    def __init__(self, in_features: int, segments: list[Segment], bias: bool = False) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = sum(s.width for s in segments)
        self.segments = segments
        self.bias: nn.Parameter | None = (
            nn.Parameter(torch.empty(self.out_features), requires_grad=False) if bias else None
        )
        self.amx_from = 0
        """Rows from which the kernel runs on AMX-INT8 tiles (0: never; use_amx())."""
        self.float_activations = False
        """x kept in fp32 instead of int8 per 32 features (use_activations())."""
        self.int16_activations = False
        """x rounded to int16 instead of int8 per 32 features (use_activations())."""
        self.lora: LoraWeights | None = None
        """The adapters beside the quantized blocks, in the model's dtype (enable_lora())."""

    use_amx = _use_amx
    use_activations = _use_activations

    def weight_bytes(self) -> int:
        return sum(s.packed.numel() for s in self.segments)

    def extra_repr(self) -> str:
        types = "+".join(GGMLQuantizationType(s.ggml_type).name for s in self.segments)
        return f"{self.in_features} -> {self.out_features}, {types} kept quantized"

    def forward(
        self,
        x: torch.Tensor,  # [m, in_features], bf16 or fp32
        residual: torch.Tensor | None = None,  # [m, out_features], x's dtype
        *,
        out_dtype: torch.dtype | None = None,
        lora: LoraBatch | None = None,  # the step's adapter rows (None: base rows only)
    ) -> torch.Tensor:  # [m, out_features]
        x = _rows(x, self.in_features)
        out = torch.empty((x.shape[0], self.out_features), dtype=out_dtype or x.dtype)
        if residual is not None and residual.stride(-1) != 1:
            residual = residual.contiguous()
        col = 0
        for s in self.segments:
            cols = slice(col, col + s.width)
            whole = len(self.segments) == 1
            quant_linear(out if whole else out[:, cols], x, s.packed, s.ggml_type,
                         None if self.bias is None else self.bias[cols],
                         residual if whole or residual is None else residual[:, cols],
                         0, self.amx_from, self.float_activations,
                         self.int16_activations)  # fmt: skip
            col += s.width
        return add_lora(out, x, self.lora, lora)


class QuantizedGateUpLinear(nn.Module):
    """GateUpLinear's forward, silu(x W_gate^T) * (x W_up^T), with SiLU-and-mul in the kernel's
    epilogue over gate/up rows interleaved by 16 (as the bf16 kernel's)."""

    activation = "silu"
    bias = None

    def __init__(self, in_features: int, width: int, ggml_type: int, packed: torch.Tensor) -> None:
        super().__init__()
        self.in_features, self.width = in_features, width
        self.ggml_type, self.packed = ggml_type, packed
        self.amx_from = 0
        self.float_activations = False
        """x kept in fp32 instead of int8 per 32 features (use_activations())."""
        self.int16_activations = False
        """x rounded to int16 instead of int8 per 32 features (use_activations())."""
        self.lora: LoraWeights | None = None

    use_amx = _use_amx
    use_activations = _use_activations

    def weight_bytes(self) -> int:
        return self.packed.numel()

    def extra_repr(self) -> str:
        name = GGMLQuantizationType(self.ggml_type).name
        return f"{self.in_features} -> 2 x {self.width}, {name} kept quantized"

    def forward(
        self, x: torch.Tensor, lora: LoraBatch | None = None
    ) -> torch.Tensor:  # [m, in_features] -> [m, width]
        x = _rows(x, self.in_features)
        if lora is not None and self.lora is not None:  # the adapters add before the activation
            return gated_with_lora(x, self.lora, lora, self._gated, self._pre_activation,
                                   self._activation)  # fmt: skip
        return self._gated(x)

    def _pre_activation(self, x: torch.Tensor) -> torch.Tensor:  # [m, in] -> [m, 2 width]
        product = torch.empty((x.shape[0], int(core.gated_rows(self.width))), dtype=x.dtype)
        quant_linear(product, x, self.packed, self.ggml_type, None, None, 0, self.amx_from,
                     self.float_activations, self.int16_activations)  # fmt: skip
        return deinterleave_gated(product, self.width)

    def _activation(self, gate_up: torch.Tensor) -> torch.Tensor:
        return gated_activation(gate_up, self.width, "silu")

    def _gated(self, x: torch.Tensor) -> torch.Tensor:  # [m, in_features] -> [m, width]
        out = torch.empty((x.shape[0], self.width), dtype=x.dtype)
        quant_linear(out, x, self.packed, self.ggml_type, None, None, self.width, self.amx_from,
                     self.float_activations, self.int16_activations)  # fmt: skip
        return out


def _rows(x: torch.Tensor, in_features: int) -> torch.Tensor:
    require(x.dim() == 2 and x.shape[-1] == in_features, "x must be [m, {}], got {}",
             in_features, tuple(x.shape))  # fmt: skip
    return x if x.stride(1) == 1 else x.contiguous()


@dataclass(frozen=True)
class KeptTensor:
    """One GGUF tensor's rows as they stay: type, the mapped [n, row bytes] array, the order
    of its rows in ours (llama.cpp's rotary permutation undone), its input features."""

    name: str
    ggml_type: int
    data: np.ndarray
    order: np.ndarray
    k: int

    def row_addresses(self) -> np.ndarray:
        return self.data.ctypes.data + self.order.astype(np.int64) * self.data.strides[0]


@dataclass
class QuantizedPlan:
    """Which layers stay quantized: module path -> its GGUF parts in fused order."""

    linears: dict[str, list[KeptTensor]] = field(default_factory=dict)
    gated: dict[str, list[KeptTensor]] = field(default_factory=dict)
    fallback: Counter[str] = field(default_factory=Counter)  # type name -> tensors dequantized
    dense: list[str] = field(default_factory=list)
    """Module paths left to the dense linears: a type without a kernel, gate and up of two
    types, tensors under other names (a fused qkv), MLPs no kernel covers (experts, GeGLU)."""
    dtype: torch.dtype = torch.float32
    """The model's dtype: what the quantized embedding's lookups return."""
    embedding: KeptTensor | None = None
    """token_embd kept in its blocks for the lookups (QuantizedEmbedding), or None: dense."""

    @property
    def every_linear_kept(self) -> bool:
        """Every linear of the model, the LM head included, runs on the quantized kernels."""
        return not self.dense and self.keeps_lm_head

    @property
    def kept(self) -> frozenset[str]:
        """GGUF tensors the loader must not dequantize (a tied embedding kept dense still is)."""
        parts = [p for ps in (*self.linears.values(), *self.gated.values()) for p in ps]
        names = {p.name for p in parts if p.name != "token_embd.weight"}
        if self.embedding is not None:
            names.add(self.embedding.name)
        return frozenset(names)

    @property
    def keeps_lm_head(self) -> bool:
        return "lm_head" in self.linears

    def describe(self) -> str:
        """E.g. "Q4_1 x 150, Q8_0 x 1 kept quantized (native avx512-vnni)"; "" when nothing is
        kept (the weights are then the compute dtype's)."""
        parts = [p for ps in (*self.linears.values(), *self.gated.values()) for p in ps]
        if not parts:
            return ""
        counts = Counter(GGMLQuantizationType(p.ggml_type).name for p in parts)
        kinds = ", ".join(f"{name} x {n}" for name, n in sorted(counts.items()))
        text = f"{kinds} kept quantized (native {quant_linear_path()})"
        if self.fallback:
            text += "; dequantized: " + ", ".join(f"{t} x {n}" for t, n in self.fallback.items())
        return text

    def install(self, model: nn.Module) -> None:
        """Replace each planned layer of `model` (built on "meta") by its quantized twin, packed
        here; a layer's bias stays a parameter for the loader to fill."""
        for path, parts in self.linears.items():
            bias = getattr(model.get_submodule(path), "bias", None) is not None
            _replace(model, path, QuantizedLinear(parts[0].k, _segments(parts), bias))
        for path, (gate, up) in self.gated.items():
            width = gate.data.shape[0]
            rows = gated_row_table(gate.row_addresses(), up.row_addresses(), width)
            packed = pack_quant_weight(gate.ggml_type, rows, gate.k)
            _replace(model, path, QuantizedGateUpLinear(gate.k, width, gate.ggml_type, packed))
        if self.embedding is not None:
            model.embed_tokens = self._embedding(model)

    def _embedding(self, model: nn.Module) -> nn.Module:
        """The lookups of the kept embedding: in the tied LM head's tiles where the head is its
        one Q8_0 tensor (one copy for both), else in a copy of its blocks (the mapped file is
        let go after loading)."""
        assert self.embedding is not None
        head = self.linears.get("lm_head", [])
        if [p.name for p in head] == [
            "token_embd.weight"
        ] and self.embedding.ggml_type == GGMLQuantizationType.Q8_0:
            head_layer = model.get_submodule("lm_head")
            assert isinstance(head_layer, QuantizedLinear), "installed above"
            [segment] = head_layer.segments
            return TiedQ8Embedding(segment.packed, segment.width, self.embedding.k, self.dtype)
        blocks = torch.from_numpy(np.array(self.embedding.data, dtype=np.uint8))
        return QuantizedEmbedding(blocks, self.embedding.ggml_type, self.embedding.k, self.dtype)


def _segments(parts: list[KeptTensor]) -> list[Segment]:
    """Runs of parts of one type, each packed as one weight of their concatenated rows."""
    segments: list[Segment] = []
    run: list[KeptTensor] = []
    for part in [*parts, None]:
        if run and (part is None or part.ggml_type != run[0].ggml_type):
            rows = np.concatenate([p.row_addresses() for p in run])
            packed = pack_quant_weight(run[0].ggml_type, rows, run[0].k)
            segments.append(Segment(run[0].ggml_type, len(rows), packed))
            run = []
        if part is not None:
            run.append(part)
    return segments


def gated_row_table(gate: np.ndarray, up: np.ndarray, width: int) -> np.ndarray:
    """Packed column c of a gated weight (core/linear.hpp's kLinearGateCols): gate row
    16 (c // 32) + c % 16, or that up row where c % 32 >= 16, 0 past width."""
    cols = np.arange(int(core.gated_rows(width)))
    out_col = (cols // 32) * 16 + cols % 16
    source = np.where(cols % 32 >= 16, up[np.minimum(out_col, width - 1)],
                      gate[np.minimum(out_col, width - 1)])  # fmt: skip
    return np.where(out_col < width, source, 0).astype(np.int64)


def _replace(model: nn.Module, path: str, module: nn.Module) -> None:
    parent, _, name = path.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, name, module)


def _kept(tensor: Any, arch: ArchConfig, heads: int) -> KeptTensor:
    n = int(tensor.data.shape[0])
    order = np.arange(n)
    if heads and arch.architecture in PERMUTED_ARCHITECTURES:
        order = unpermute_rotary(torch.arange(n), heads).numpy()
    return KeptTensor(tensor.name, int(tensor.tensor_type), tensor.data, order,
                      int(tensor.shape[0]))  # fmt: skip


def _layer_parts(arch: ArchConfig, i: int) -> dict[str, list[tuple[str, int]]]:
    """Module path -> (GGUF tensor, heads of its rotary permutation or 0) in fused order."""
    blk, path = f"blk.{i}.", f"layers.{i}."
    parts = {
        path + "qkv_proj": [(blk + "attn_q.weight", arch.num_heads),
                            (blk + "attn_k.weight", arch.num_kv_heads), (blk + "attn_v.weight", 0)],
        path + "o_proj": [(blk + "attn_output.weight", 0)],
    }  # fmt: skip
    if not arch.is_moe_layer(i) and arch.hidden_act == "silu":
        parts[path + "mlp.gate_up_proj"] = [
            (blk + "ffn_gate.weight", 0),
            (blk + "ffn_up.weight", 0),
        ]
        parts[path + "mlp.down_proj"] = [(blk + "ffn_down.weight", 0)]
    return parts


def plan_quantized(
    reader: GGUFReader,
    arch: ArchConfig,
    *,
    dtype: torch.dtype,
    device: torch.device,
    quiet: bool = False,
) -> QuantizedPlan:
    """The layers whose GGUF tensors all have a kernel (CPU, bf16 or fp32 activations);
    quiet: no log of what is dequantized (a look ahead, as --dtype auto's)."""
    plan = QuantizedPlan(dtype=dtype)
    if device.type != "cpu" or dtype not in (torch.bfloat16, torch.float32):
        logger.info("quantization auto: kernels are CPU bf16/fp32 only; dequantizing to %s", dtype)
        return plan
    tensors = {t.name: t for t in reader.tensors}
    head = "output.weight" if "output.weight" in tensors else "token_embd.weight"
    wanted = {"lm_head": [(head, 0)]}
    for i in range(arch.num_layers):
        layer = _layer_parts(arch, i)
        if f"layers.{i}.mlp.down_proj" not in layer:
            plan.dense.append(f"layers.{i}.mlp")
        wanted.update(layer)
    for path, names in wanted.items():
        found = [tensors.get(name) for name, _ in names]
        if any(t is None for t in found):
            plan.dense.append(path)
            continue
        types = [GGMLQuantizationType(t.tensor_type) for t in found if t is not None]
        if not all(int(t) in QUANT_TYPES for t in types):
            plan.dense.append(path)
            plan.fallback.update(
                t.name for t in types if t not in _PLAIN and int(t) not in QUANT_TYPES
            )
            continue
        parts = [_kept(t, arch, h) for t, (_, h) in zip(found, names, strict=True)]
        if not path.endswith("gate_up_proj"):
            plan.linears[path] = parts
        elif parts[0].ggml_type == parts[1].ggml_type:  # else dequantized: the epilogue needs both
            plan.gated[path] = parts
        else:
            plan.dense.append(path)
    embedding = tensors.get("token_embd.weight")
    if (
        embedding is not None
        and GGMLQuantizationType(embedding.tensor_type) not in _PLAIN
        and (plan.keeps_lm_head or head == "output.weight")  # no dense tied head needs it
    ):
        plan.embedding = _kept(embedding, arch, 0)
    if plan.fallback and not quiet:
        logger.warning("quantization auto: no kernel for %s; those weights are dequantized",
                       ", ".join(sorted(plan.fallback)))  # fmt: skip
    return plan
