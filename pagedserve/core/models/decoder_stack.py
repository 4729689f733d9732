"""Where the native decoder stack (ops/decoder_stack.py) applies, and each layer's weights.

    stack = DecoderStack.build(model.layers)       # None where it does not apply
    hidden = stack(hidden, cos, signed_sin, kv_caches, meta)   # in place into hidden

It applies where every piece of a layer runs natively anyway: bfloat16 on a CPU with
AVX512-BF16 (all projections packed), an attention backend whose kernels the stack calls
(`native_decoder_stack`), eager mode (traced code keeps the per-layer ops). Everything else,
float32 and so the transformers oracle included, runs the layers one by one as before.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from pagedserve.core.ops.decoder_stack import LayerWeights, NativeDecoderStack, StackShape


class DecoderStack(NativeDecoderStack):
    @classmethod
    def build(cls, layers: Sequence[nn.Module]) -> DecoderStack | None:
        """A stack over these LlamaDecoderLayers, or None unless every layer is bf16 on the CPU
        with packed projections and an attention backend the native stack can stand in for."""
        if not layers or not all(_applies(layer) for layer in layers):
            return None
        first = layers[0]
        shape = StackShape(
            hidden_size=first.input_layernorm.shape[0],
            num_heads=first.num_heads,
            num_kv_heads=first.num_kv_heads,
            head_size=first.head_size,
            intermediate_size=first.intermediate_size,
            rms_norm_eps=first.eps,
            scale=first.scale,
        )
        return cls(shape, [_weights(layer) for layer in layers], owner=list(layers))


def _applies(layer: nn.Module) -> bool:
    """Only Llama-shaped layers (a window and attention soft-capping included, which the
    stack passes to its kernels): q/k norms, sandwich norms, GeGLU, experts or a second rope
    keep the per-layer path."""
    if not getattr(layer, "llama_shaped", False):
        return False
    mlp = layer.mlp
    projections = (layer.qkv_proj, layer.o_proj, mlp.gate_up_proj, mlp.down_proj)
    attention, bias = layer.attention, layer.qkv_proj.bias
    return (
        all(p.packed is not None for p in projections)
        and layer.o_proj.bias is None
        and mlp.gate_up_proj.bias is None
        and mlp.down_proj.bias is None
        and getattr(attention, "native_decoder_stack", False)
        and all(
            w.dtype == torch.bfloat16 and w.device.type == "cpu" and w.is_contiguous()
            for w in (layer.input_layernorm, layer.post_attention_layernorm)
        )
        and (bias is None or (bias.dtype == torch.bfloat16 and bias.is_contiguous()))
    )


def _weights(layer: nn.Module) -> LayerWeights:
    bias = layer.qkv_proj.bias
    return LayerWeights(
        input_norm=layer.input_layernorm.data_ptr(),
        qkv=layer.qkv_proj.packed.data_ptr(),
        qkv_bias=0 if bias is None else bias.data_ptr(),
        o=layer.o_proj.packed.data_ptr(),
        post_norm=layer.post_attention_layernorm.data_ptr(),
        gate_up=layer.mlp.gate_up_proj.packed.data_ptr(),
        down=layer.mlp.down_proj.packed.data_ptr(),
        sliding_window=layer.sliding_window,
        logit_softcap=layer.logit_softcap,
    )
