"""llama.cpp's architectures as GGUF metadata: per architecture, the ArchConfig fields its keys
set beyond the common ones, and the keys we know.

llama.cpp's converter (convert_hf_to_gguf.py) writes these keys and llama.cpp's loader
(src/llama-model.cpp) reads them with defaults of its own; the defaults here are llama.cpp's,
so a file means here what it means there. A key under the architecture's prefix that we do not
know is refused, naming it: it may change what the model computes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from pagedserve.core.models.arch import FULL, SLIDING

Meta = dict[str, Any]
"""A file's `{arch}.*` keys, the `{arch}.` prefix removed."""

_COMMON_KEYS = frozenset({
    "context_length", "embedding_length", "block_count", "feed_forward_length", "vocab_size",
    "attention.head_count", "attention.head_count_kv", "attention.layer_norm_rms_epsilon",
    "attention.key_length", "attention.value_length", "rope.dimension_count", "rope.freq_base",
    "rope.scaling.type", "rope.scaling.factor", "rope.scaling.original_context_length",
    "rope.scaling.finetuned", "tensor_data_layout", "pooling_type",
})  # fmt: skip
_MOE_KEYS = frozenset({
    "expert_count", "expert_used_count", "expert_feed_forward_length",
    "expert_shared_feed_forward_length", "expert_weights_norm",
})  # fmt: skip
_GEMMA2_KEYS = frozenset(
    {"attn_logit_softcapping", "final_logit_softcapping", "attention.sliding_window"}
)
_GEMMA3_KEYS = frozenset(
    {"final_logit_softcapping", "attention.sliding_window", "rope.freq_base_swa"}
)
_PHI3_KEYS = frozenset({"attention.sliding_window", "rope.scaling.attn_factor"})
# llama.cpp's Gemma attention scale is head_size ** -0.5, except for the 27B models (known by
# their layer count), whose query_pre_attn_scalar is hidden_size / num_heads.
_GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}


def _raw_window(meta: Meta, default: int = 0) -> int:
    return int(meta.get("attention.sliding_window", default) or 0)


def _window(meta: Meta, default: int = 0) -> int:
    """The sliding window; one at least as long as the context changes nothing (full)."""
    window = _raw_window(meta, default)
    return 0 if window >= int(meta.get("context_length", 0) or 0) > 0 else window


def _layer_types(num_layers: int, period: int) -> tuple[str, ...]:
    """llama.cpp's swa pattern: within each period, every layer but the last slides."""
    return tuple(SLIDING if i % period < period - 1 else FULL for i in range(num_layers))


def _gemma(meta: Meta, arch: str, period: int, default_window: int = 0) -> dict[str, Any]:
    """Layer types follow llama.cpp's pattern wherever the file has a window (the sliding
    layers keep Gemma 3's local rope even when the window spans the whole context)."""
    hidden, heads = int(meta["embedding_length"]), int(meta["attention.head_count"])
    num_layers = int(meta["block_count"])
    head = int(meta.get("attention.key_length", hidden // heads))
    big = num_layers == _GEMMA_27B_LAYERS[arch]
    types = _layer_types(num_layers, period) if _raw_window(meta, default_window) else ()
    return {
        "embed_scale": math.sqrt(hidden),
        "sandwich_norms": True,
        "hidden_act": "gelu_tanh",
        "query_pre_attn_scalar": float(hidden // heads if big else head),
        "sliding_window": _window(meta, default_window),
        "layer_types": types,
    }


def _gemma2(meta: Meta) -> dict[str, Any]:
    # llama.cpp's Gemma 2 defaults: a 4096 window, soft-caps 50 (attention) and 30 (output).
    return {
        **_gemma(meta, "gemma2", 2, 4096),
        "attn_logit_softcap": float(meta.get("attn_logit_softcapping", 50.0)),
        "final_logit_softcap": float(meta.get("final_logit_softcapping", 30.0)),
    }


def _gemma3(meta: Meta) -> dict[str, Any]:
    # No window key (or 0): every layer global, on the one rope (llama.cpp's swa type NONE).
    local_theta = float(meta.get("rope.freq_base_swa", 10000.0)) if _raw_window(meta) else 0.0
    return {
        **_gemma(meta, "gemma3", 6),
        "final_logit_softcap": float(meta.get("final_logit_softcapping", 0.0)),
        "local_rope_theta": local_theta,
    }


def _phi3(meta: Meta) -> dict[str, Any]:
    # llama.cpp reads Phi-3's window but runs full attention (its own warning says results may
    # suffer); transformers, the reference, applies it, and so do we (as from the HF folder).
    return {"sliding_window": _window(meta)}


def _qwen2vl(meta: Meta) -> dict[str, Any]:
    """Qwen2-VL's multimodal rotary: [temporal, height, width, 0] frequency pairs (llama.cpp
    requires the key). Text alone rotates every section by the one position, as plain rope."""
    sections = meta.get("rope.dimension_sections")
    if not isinstance(sections, list) or len(sections) != 4:
        raise ValueError(f"GGUF key 'qwen2vl.rope.dimension_sections' must list 4 sections, "
                         f"got {sections!r}")  # fmt: skip
    if sections[3]:
        raise ValueError(f"GGUF key 'qwen2vl.rope.dimension_sections' {sections}: a fourth "
                         "section is not supported")  # fmt: skip
    return {"mrope_section": tuple(int(s) for s in sections[:3])}


def _none(meta: Meta) -> dict[str, Any]:
    return {}


# GGUF general.architecture -> (its fields beyond the common ones, the keys it may carry).
GGUF_FIELDS: dict[str, tuple[Callable[[Meta], dict[str, Any]], frozenset[str]]] = {
    "llama": (_none, _MOE_KEYS),
    "qwen2": (_none, frozenset()),
    "qwen3": (_none, frozenset()),
    "qwen2vl": (_qwen2vl, frozenset({"rope.dimension_sections"})),
    "qwen2moe": (_none, _MOE_KEYS),
    "qwen3moe": (_none, _MOE_KEYS),
    "gemma2": (_gemma2, _GEMMA2_KEYS),
    "gemma3": (_gemma3, _GEMMA3_KEYS),
    "phi3": (_phi3, _PHI3_KEYS),
}


def check_keys(meta: Meta, arch: str) -> None:
    """Refuse, naming it, a key we do not know or a value we do not implement."""
    known = _COMMON_KEYS | GGUF_FIELDS[arch][1]
    for key in sorted(meta):
        if key not in known:
            raise ValueError(f"GGUF key '{arch}.{key}' is not supported for {arch!r} models")
    heads = int(meta["attention.head_count"])
    head = meta.get("attention.key_length", int(meta["embedding_length"]) // heads)
    for key in ("attention.value_length", "rope.dimension_count"):
        if meta.get(key, head) != head:
            raise ValueError(
                f"GGUF key '{arch}.{key}' ({meta[key]}) differs from the head size ({head}): "
                "not supported"
            )


def arch_fields(meta: Meta, arch: str) -> dict[str, Any]:
    """The ArchConfig fields this architecture sets beyond the common ones."""
    check_keys(meta, arch)
    return GGUF_FIELDS[arch][0](meta)
