"""GGUF loader: arch metadata and dequantized weights under HF tensor names.

The file is memory-mapped by gguf.GGUFReader; each tensor is dequantized to float32 as it is
yielded, so at most one dequantized tensor beyond the model's own weights is alive at a time.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType
from gguf.quants import dequantize

from pagedserve.core.gguf_reader import gguf_reader
from pagedserve.core.models.arch import ArchConfig
from pagedserve.core.models.families import refuse_encoder_only
from pagedserve.core.models.gguf_arch import arch_fields

Q = GGMLQuantizationType
SUPPORTED_TYPES = frozenset(
    {Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1}
    | {Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K}
)
# GGUF general.architecture -> our family (a "llama" file with experts is a Mixtral).
GGUF_ARCHITECTURES = {
    "llama": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "qwen2vl": "qwen2",  # Qwen2(.5)-VL's language model: text alone, or qwen2_5_vl with --mmproj
    "qwen2moe": "qwen2_moe",
    "qwen3moe": "qwen3_moe",
    "gemma2": "gemma2",
    "gemma3": "gemma3_text",
    "phi3": "phi3",
}
# llama.cpp's converter interleaves the rotary halves of Q/K rows for these families only.
PERMUTED_ARCHITECTURES = ("llama", "mixtral")
# llama.cpp's top-k renormalization where a file has no expert_weights_norm key.
_DEFAULT_NORM_TOPK = {"llama": True, "qwen3moe": True, "qwen2moe": False}

_TOP_LEVEL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
}
# Where an architecture's GGUF names map to other HF names than Llama's: Gemma's sandwich norms
# (its converter already stored them as 1 + weight: nothing to add), Phi-3's fused q/k/v and
# gate/up (gate rows first, as in the HF checkpoint).
_GEMMA_NAMES = {
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_ARCH_LAYER_NAMES = {
    "gemma2": _GEMMA_NAMES,
    "gemma3": _GEMMA_NAMES,
    "phi3": {"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"},
}
# Tensors folded into ArchConfig.rope_scaling (Llama 3.1's freq factors, Phi-3's longrope).
_ROPE_TENSORS = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")
# [num_experts, out, in] tensors, split into one HF-named weight per expert.
_EXPERT_NAMES = {
    "ffn_gate_exps": "gate_proj",
    "ffn_up_exps": "up_proj",
    "ffn_down_exps": "down_proj",
}
_LAYER_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def _field(reader: GGUFReader, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    if field is None:
        return default
    value = field.parts[field.data[0]]
    if field.types and field.types[0].name == "STRING":
        return bytes(value).decode("utf-8")
    return value.item() if value.size == 1 else value.tolist()


def _tensor(reader: GGUFReader, name: str) -> Any:
    return next((t for t in reader.tensors if t.name == name), None)


def _longrope(reader: GGUFReader, arch: str, long: Any) -> dict[str, Any]:
    """Phi-3's longrope: both factor tensors, the original context, the attention factor."""
    short = _tensor(reader, "rope_factors_short.weight")
    if short is None:
        raise ValueError("GGUF has rope_factors_long.weight but no rope_factors_short.weight")
    original = _field(reader, f"{arch}.rope.scaling.original_context_length")
    if original is None:
        raise ValueError(
            f"GGUF has longrope factors but no {arch}.rope.scaling.original_context_length"
        )
    return {
        "rope_type": "longrope",
        "long_factor": to_numpy(long).tolist(),
        "short_factor": to_numpy(short).tolist(),
        "original_max_position_embeddings": int(original),
        "max_position_embeddings": int(_field(reader, f"{arch}.context_length")),
        "attention_factor": _field(reader, f"{arch}.rope.scaling.attn_factor"),
    }


def _rope_scaling(reader: GGUFReader, arch: str) -> dict[str, Any] | None:
    scaling_type = _field(reader, f"{arch}.rope.scaling.type", "none")
    long = _tensor(reader, "rope_factors_long.weight")
    if long is not None and scaling_type in ("none", "longrope", None):
        return _longrope(reader, arch, long)
    if scaling_type == "linear":
        return {
            "rope_type": "linear",
            "factor": float(_field(reader, f"{arch}.rope.scaling.factor")),
        }
    if scaling_type not in ("none", None):
        raise ValueError(f"GGUF rope scaling type {scaling_type!r} is not supported")
    freqs = _tensor(reader, "rope_freqs.weight")
    if freqs is not None:
        return {"rope_type": "freq_factors", "factors": to_numpy(freqs).tolist()}
    return None


def _experts(reader: GGUFReader, arch: str) -> dict[str, Any]:
    num = int(_field(reader, f"{arch}.expert_count", 0) or 0)
    if not num:
        return {}
    norm = _field(reader, f"{arch}.expert_weights_norm", _DEFAULT_NORM_TOPK.get(arch, False))
    return {
        "num_experts": num,
        "num_experts_per_tok": int(_field(reader, f"{arch}.expert_used_count")),
        "norm_topk_prob": bool(norm),
        "moe_intermediate_size": int(
            _field(reader, f"{arch}.expert_feed_forward_length", 0)
            or _field(reader, f"{arch}.feed_forward_length")
        ),
        "shared_expert_intermediate_size": int(
            _field(reader, f"{arch}.expert_shared_feed_forward_length", 0) or 0
        ),
    }


def arch_from_gguf(reader: GGUFReader) -> ArchConfig:
    arch = _field(reader, "general.architecture")
    refuse_encoder_only(str(arch))
    if arch not in GGUF_ARCHITECTURES:
        raise ValueError(
            f"GGUF architecture {arch!r} is not supported "
            f"(supported: {', '.join(GGUF_ARCHITECTURES)})"
        )
    names = {t.name for t in reader.tensors}
    hidden = int(_field(reader, f"{arch}.embedding_length"))
    num_heads = int(_field(reader, f"{arch}.attention.head_count"))
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    vocab = _field(reader, f"{arch}.vocab_size") or (len(tokens.data) if tokens else None)
    if vocab is None:
        raise ValueError(f"GGUF has neither {arch}.vocab_size nor tokenizer.ggml.tokens")
    experts = _experts(reader, arch)
    family = "mixtral" if arch == "llama" and experts else GGUF_ARCHITECTURES[arch]
    return ArchConfig(
        architecture=family,
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(_field(reader, f"{arch}.feed_forward_length", 0) or 0),
        num_layers=int(_field(reader, f"{arch}.block_count")),
        num_heads=num_heads,
        num_kv_heads=int(_field(reader, f"{arch}.attention.head_count_kv", num_heads)),
        head_size=int(_field(reader, f"{arch}.attention.key_length", hidden // num_heads)),
        rms_norm_eps=float(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon")),
        rope_theta=float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
        rope_scaling=_rope_scaling(reader, arch),
        max_position_embeddings=int(_field(reader, f"{arch}.context_length", 2048)),
        tie_word_embeddings="output.weight" not in names,
        attention_bias="blk.0.attn_q.bias" in names,
        o_proj_bias="blk.0.attn_output.bias" in names,
        qk_norm="blk.0.attn_q_norm.weight" in names,
        **experts,
        **arch_fields(_metadata(reader, arch), arch),
    )


def _metadata(reader: GGUFReader, arch: str) -> dict[str, Any]:
    """The file's `{arch}.*` keys, without the prefix (an array key as a list)."""
    prefix = f"{arch}."
    return {
        k.removeprefix(prefix): _array(reader, k) if _is_array(reader, k) else _field(reader, k)
        for k in reader.fields
        if k.startswith(prefix)
    }


def _is_array(reader: GGUFReader, key: str) -> bool:
    field = reader.fields[key]
    return bool(field.types) and field.types[0] == GGUFValueType.ARRAY


def _array(reader: GGUFReader, key: str) -> list[Any]:
    """An array key's values (numbers or strings)."""
    values = reader.fields[key].contents()
    return list(values) if isinstance(values, list) else [values]


def to_numpy(tensor: Any) -> np.ndarray:
    """Dequantize one GGUF tensor to a float32 array in torch's [out, in] order."""
    qtype = GGMLQuantizationType(tensor.tensor_type)
    if qtype not in SUPPORTED_TYPES:
        raise ValueError(f"GGUF tensor {tensor.name!r} has unsupported type {qtype.name}")
    shape = tuple(int(d) for d in reversed(tensor.shape))  # GGUF lists dims innermost first
    return np.asarray(dequantize(tensor.data, qtype), dtype=np.float32).reshape(shape)


def _hf_names(name: str, num_experts: int, arch: str = "llama") -> list[str]:
    """The HF names one GGUF tensor holds: none (rope factors), one, or one per expert."""
    if name in _TOP_LEVEL_NAMES:
        return [_TOP_LEVEL_NAMES[name]]
    if name in _ROPE_TENSORS:
        return []  # folded into ArchConfig.rope_scaling
    layer_names = {**_LAYER_NAMES, **_ARCH_LAYER_NAMES.get(arch, {})}
    match = _LAYER_RE.fullmatch(name)
    if match is None or match.group(2) not in {**layer_names, **_EXPERT_NAMES}:
        raise ValueError(f"GGUF tensor {name!r} is not part of a supported model")
    layer, part, kind = match.groups()
    if part in _EXPERT_NAMES:
        prefix = f"model.layers.{layer}.mlp.experts"
        return [f"{prefix}.{e}.{_EXPERT_NAMES[part]}.{kind}" for e in range(num_experts)]
    return [f"model.layers.{layer}.{layer_names[part]}.{kind}"]


def unpermute_rotary(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's Q/K row permutation: within each head, rows stored as interleaved pairs
    (x0, x_half, x1, x_half+1, ...) go back to HF's halves order (x0, x1, ..., x_half, ...)."""
    shape = weight.shape
    head = shape[0] // num_heads
    return weight.reshape(num_heads, head // 2, 2, *shape[1:]).transpose(1, 2).reshape(shape)


def count_gguf_weights(
    reader: GGUFReader, num_experts: int = 0, skip: frozenset[str] = frozenset()
) -> int:
    arch = _field(reader, "general.architecture")
    return sum(
        len(_hf_names(t.name, num_experts, arch)) for t in reader.tensors if t.name not in skip
    )


def iter_gguf_weights(
    reader: GGUFReader, arch: ArchConfig, skip: frozenset[str] = frozenset()
) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, float32 tensor) for every weight but the GGUF tensors named in skip (kept
    quantized, models/linear/quantized.py), Q/K rows back in HF's rotary order."""
    permuted = arch.architecture in PERMUTED_ARCHITECTURES
    gguf_arch = _field(reader, "general.architecture")
    for tensor in reader.tensors:
        names = _hf_names(tensor.name, arch.num_experts, gguf_arch)
        if not names or tensor.name in skip:
            continue
        # F32 tensors are read-only views of the mapped file: copy those, not the fresh ones.
        weight = torch.from_numpy(np.require(to_numpy(tensor), requirements=["C", "W"]))
        if len(names) > 1:  # [num_experts, out, in]
            yield from zip(names, weight.unbind(0), strict=True)
            continue
        name = names[0]
        if permuted and ".q_proj." in name:
            weight = unpermute_rotary(weight, arch.num_heads)
        elif permuted and ".k_proj." in name:
            weight = unpermute_rotary(weight, arch.num_kv_heads)
        yield name, weight


def open_gguf(path: Path) -> tuple[ArchConfig, GGUFReader]:
    reader = gguf_reader(path)
    return arch_from_gguf(reader), reader
