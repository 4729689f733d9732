"""Where the native decoder stack (models/decoder_stack/ops.py) applies, and each layer's weights.

    stack = DecoderStack.build(model.layers)       # None where it does not apply
    stack.attach_lora(model.layers)                # the layers' adapter stacks (enable_lora)
    hidden = stack(hidden, cos, signed_sin, kv_caches, meta, lora)   # in place into hidden

It applies where every piece of a layer runs natively anyway: on an x86-64 CPU from ISA level
avx2, bfloat16 with all projections packed or kept quantized as one GGUF type each (which the
stack runs on the same quantized kernel: models/linear/quantized.py), or float32 with every
projection kept quantized; an attention backend whose kernels the stack calls
(`native_decoder_stack`); eager mode (traced code keeps the per-layer ops). Everything else,
dense float32 and so the transformers oracle included, runs the layers one by one as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from pagedserve.core.attention.base import AttentionBackend
from pagedserve.core.lora.weights import LoraWeights
from pagedserve.core.models.decoder_stack.ops import NativeDecoderStack, StackShape
from pagedserve.core.models.linear.dense import PackableLinear
from pagedserve.core.models.linear.quantized import QuantizedGateUpLinear, QuantizedLinear
from pagedserve.core.models.moe import DenseMLP, SparseMoE
from pagedserve.core.ops.native import core


class StackableLayer(Protocol):
    """What the stack reads of a decoder layer (llama.py's LlamaDecoderLayer)."""

    @property
    def llama_shaped(self) -> bool: ...
    @property
    def mlp(self) -> DenseMLP | SparseMoE: ...

    @property
    def input_layernorm(self) -> torch.Tensor: ...
    @property
    def post_attention_layernorm(self) -> torch.Tensor: ...
    @property
    def qkv_proj(self) -> PackableLinear: ...
    @property
    def o_proj(self) -> PackableLinear: ...
    @property
    def attention(self) -> AttentionBackend: ...
    @property
    def num_heads(self) -> int: ...
    @property
    def num_kv_heads(self) -> int: ...
    @property
    def head_size(self) -> int: ...
    @property
    def intermediate_size(self) -> int: ...
    @property
    def eps(self) -> float: ...
    @property
    def scale(self) -> float: ...
    @property
    def sliding_window(self) -> int: ...
    @property
    def logit_softcap(self) -> float: ...


class DecoderStack(NativeDecoderStack):
    @classmethod
    def build(cls, layers: Sequence[StackableLayer]) -> DecoderStack | None:
        """A stack over these LlamaDecoderLayers, or None unless every layer is bf16 (fp32 with
        every projection kept quantized) on the CPU with packed projections and an attention
        backend the native stack can stand in for."""
        if not layers or not all(_applies(layer) for layer in layers):
            return None
        first = layers[0]
        if any(layer.input_layernorm.dtype != first.input_layernorm.dtype for layer in layers):
            return None
        shape = StackShape(
            hidden_size=first.input_layernorm.shape[0],
            num_heads=first.num_heads,
            num_kv_heads=first.num_kv_heads,
            head_size=first.head_size,
            intermediate_size=first.intermediate_size,
            rms_norm_eps=first.eps,
            scale=first.scale,
            batch_invariant=first.attention.batch_invariant,
            float32=first.input_layernorm.dtype == torch.float32,
        )
        stack = cls(shape, [_weights(layer) for layer in layers], owner=list(layers))
        stack.attach_lora(layers)
        return stack

    def attach_lora(self, layers: Sequence[StackableLayer]) -> None:
        """The adapters' stacks of each layer's projections (LlamaForCausalLM.enable_lora()),
        where any layer has some; steps with adapter rows then stay on the stack."""
        found = [_lora(layer) for layer in layers]
        if any(any(p is not None for p in layer) for layer in found):
            native = [core.DecoderLayerLora(qkv=_view(qkv), o=_view(o), gate_up=_view(gate_up),
                                            down=_view(down))
                      for qkv, o, gate_up, down in found]  # fmt: skip
            self.set_lora(native, owner=found)


LayerLora = tuple[LoraWeights | None, LoraWeights | None, LoraWeights | None, LoraWeights | None]


def _lora(layer: StackableLayer) -> LayerLora:
    """The stacks beside qkv, o, gate_up and down (None: none there)."""
    mlp = layer.mlp
    assert isinstance(mlp, DenseMLP)  # _applies checked it
    found = (layer.qkv_proj, layer.o_proj, mlp.gate_up_proj, mlp.down_proj)
    kinds = PackableLinear | QuantizedLinear | QuantizedGateUpLinear
    qkv, o, gate_up, down = (p.lora if isinstance(p, kinds) else None for p in found)
    return qkv, o, gate_up, down


def _view(weights: LoraWeights | None) -> core.LoraStacks | None:
    return None if weights is None else weights.native_stacks()


def _applies(layer: StackableLayer) -> bool:
    """Only Llama-shaped layers (a window and attention soft-capping included, which the
    stack passes to its kernels): q/k norms, sandwich norms, GeGLU, experts or a second rope
    keep the per-layer path."""
    mlp = layer.mlp
    if not layer.llama_shaped or not isinstance(mlp, DenseMLP):
        return False
    projections = (layer.qkv_proj, layer.o_proj, mlp.gate_up_proj, mlp.down_proj)
    attention, bias = layer.attention, layer.qkv_proj.bias
    dtype = layer.input_layernorm.dtype
    quantized = all(isinstance(p, QuantizedLinear | QuantizedGateUpLinear) for p in projections)
    if not (dtype == torch.bfloat16 or (dtype == torch.float32 and quantized)):
        return False
    return (
        all(_stackable(p) for p in projections)
        and layer.o_proj.bias is None
        and mlp.gate_up_proj.bias is None
        and mlp.down_proj.bias is None
        and attention.native_decoder_stack
        and all(
            w.dtype == dtype and w.device.type == "cpu" and w.is_contiguous()
            for w in (layer.input_layernorm, layer.post_attention_layernorm)
        )
        and (bias is None or (bias.dtype == dtype and bias.is_contiguous()))
    )


def _stackable(linear: object) -> bool:
    """Packed bf16, or kept quantized in one segment (one GGUF type)."""
    if isinstance(linear, QuantizedLinear):
        return len(linear.segments) == 1
    if isinstance(linear, QuantizedGateUpLinear):
        return True
    return isinstance(linear, PackableLinear) and linear.packed is not None


def _projection(linear: object) -> tuple[int, int]:
    """(pointer to the packed weight, its ggml type or 0 for packed bf16)."""
    if isinstance(linear, QuantizedLinear):
        segment = linear.segments[0]  # _applies checked there is one
        return segment.packed.data_ptr(), segment.ggml_type
    if isinstance(linear, QuantizedGateUpLinear):
        return linear.packed.data_ptr(), linear.ggml_type
    assert isinstance(linear, PackableLinear) and linear.packed is not None  # _applies did
    return linear.packed.data_ptr(), 0


def _weights(layer: StackableLayer) -> core.DecoderLayerWeights:
    bias, mlp = layer.qkv_proj.bias, layer.mlp
    assert isinstance(mlp, DenseMLP)  # _applies checked it
    (qkv, qkv_type), (o, o_type) = _projection(layer.qkv_proj), _projection(layer.o_proj)
    gate_up, gate_up_type = _projection(mlp.gate_up_proj)
    down, down_type = _projection(mlp.down_proj)
    return core.DecoderLayerWeights(
        input_norm=layer.input_layernorm.data_ptr(),
        qkv=qkv,
        qkv_bias=0 if bias is None else bias.data_ptr(),
        o=o,
        post_norm=layer.post_attention_layernorm.data_ptr(),
        gate_up=gate_up,
        down=down,
        sliding_window=layer.sliding_window,
        logit_softcap=layer.logit_softcap,
        qkv_type=qkv_type,
        o_type=o_type,
        gate_up_type=gate_up_type,
        down_type=down_type,
    )
