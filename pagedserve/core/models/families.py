"""The model families: for each HF model_type, how its config.json maps onto ArchConfig and how
its weight names differ from Llama's. Everything else (the layers) is shared: llama.py builds
every family from the ArchConfig fields, moe.py adds the sparse MLP.

A config field we do not implement is refused here, naming it: a model never loads and then
produces wrong tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pagedserve.core.models.arch import FULL, SLIDING, ArchConfig, VisionConfig

Config = dict[str, Any]


@dataclass(frozen=True)
class Family:
    fields: Callable[[Config], dict[str, Any]]
    """config.json -> the ArchConfig fields beyond the common ones (raises on what we lack)."""
    renames: dict[str, str] = field(default_factory=dict)
    """HF weight suffix inside a layer -> the Llama-style suffix registry.py knows."""


def _refuse_if(condition: Any, name: str, why: str) -> None:
    if condition:
        raise ValueError(f"config field {name!r}: {why} is not supported")


def _activation(config: Config) -> str:
    act = config.get("hidden_activation") or config.get("hidden_act") or "silu"
    names = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}
    _refuse_if(act not in names, "hidden_act", f"activation {act!r}")
    return names[act]


def _rope(params: Config | None, theta: float | None) -> tuple[float, dict[str, Any] | None]:
    """(theta, scaling) from transformers <5 (rope_theta + rope_scaling) or >=5 (rope_parameters
    holding both)."""
    if theta is None:
        theta = (params or {}).get("rope_theta", 10000.0)
    if params is not None:
        rope_type = params.get("rope_type", params.get("type", "default"))
        rope_type = "longrope" if rope_type == "su" else rope_type
        params = None if rope_type == "default" else {**params, "rope_type": rope_type}
    return float(theta), params


def _layer_types(config: Config, default: Callable[[int], bool] | None) -> tuple[str, ...]:
    """config's layer_types, else `default(i)` (is layer i sliding?), else () (all alike)."""
    if config.get("layer_types"):
        return tuple(config["layer_types"])
    if default is None:
        return ()
    return tuple(SLIDING if default(i) else FULL for i in range(config["num_hidden_layers"]))


def _window(config: Config, layer_types: tuple[str, ...]) -> int:
    window = config.get("sliding_window") or 0
    if layer_types and SLIDING not in layer_types:
        return 0
    # A window at least as long as any context changes nothing: treat it as full attention.
    return 0 if window >= config.get("max_position_embeddings", 0) > 0 else int(window)


def _qwen_window(config: Config) -> dict[str, Any]:
    """Qwen2/3 (dense and MoE): a window only when use_sliding_window and layer_types say so."""
    if not config.get("use_sliding_window"):
        return {}
    _refuse_if(not config.get("layer_types"), "use_sliding_window", "a window without layer_types")
    types = _layer_types(config, None)
    return {"sliding_window": _window(config, types), "layer_types": types}


def _llama(config: Config) -> dict[str, Any]:
    _refuse_if(config.get("mlp_bias"), "mlp_bias", "a bias on the MLP")
    bias = bool(config.get("attention_bias", False))
    return {"attention_bias": bias, "o_proj_bias": bias}


def _mistral(config: Config) -> dict[str, Any]:
    return {"sliding_window": _window(config, ())}


def _qwen2(config: Config) -> dict[str, Any]:
    return {"attention_bias": True, **_qwen_window(config)}


def _qwen3(config: Config) -> dict[str, Any]:
    return {**_llama(config), "qk_norm": True, **_qwen_window(config)}


def _qwen2_5_vl(config: Config) -> dict[str, Any]:
    """Qwen2.5-VL: Qwen2's decoder, multimodal rotary, the vision tower (`text_config` merged
    into the top level by `arch_from_hf_config`)."""
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    _refuse_if(rope_type not in ("default", "mrope"), "rope_scaling", f"rope type {rope_type!r}")
    section = tuple(int(x) for x in rope.get("mrope_section", (16, 24, 24)))
    vision: dict[str, Any] = config.get("vision_config") or {}
    _refuse_if(vision.get("model_type", "qwen2_5_vl") not in ("qwen2_5_vl", "qwen2_5_vl_vision"),
               "vision_config",
               f"a {vision.get('model_type')!r} tower")  # fmt: skip
    tower = VisionConfig(
        depth=int(vision["depth"]),
        hidden_size=int(vision["hidden_size"]),
        num_heads=int(vision["num_heads"]),
        intermediate_size=int(vision["intermediate_size"]),
        out_hidden_size=int(vision.get("out_hidden_size") or config["hidden_size"]),
        patch_size=int(vision.get("patch_size", 14)),
        temporal_patch_size=int(vision.get("temporal_patch_size", 2)),
        spatial_merge_size=int(vision.get("spatial_merge_size", 2)),
        window_size=int(vision.get("window_size", 112)),
        fullatt_block_indexes=tuple(int(i) for i in vision.get("fullatt_block_indexes", ())),
        in_channels=int(vision.get("in_channels", vision.get("in_chans", 3))),
        hidden_act=str(vision.get("hidden_act", "silu")),
        image_token_id=int(config["image_token_id"]),
    )
    return {**_qwen2(config), "rope_scaling": None, "mrope_section": section, "vision": tower}


def _gemma3_vl(config: Config) -> dict[str, Any]:
    """Gemma 3 with images: Gemma 3's decoder (`text_config` merged into the top level by
    `arch_from_hf_config`), a SigLIP tower, its tokens average-pooled to mm_tokens_per_image."""
    vision: dict[str, Any] = {**_SIGLIP_DEFAULTS, **(config.get("vision_config") or {})}
    _refuse_if(vision["model_type"] != "siglip_vision_model", "vision_config",
               f"a {vision['model_type']!r} tower")  # fmt: skip
    _refuse_if(vision.get("vision_use_head"), "vision_config.vision_use_head", "a pooling head")
    _refuse_if(vision["hidden_act"] != "gelu_pytorch_tanh", "vision_config.hidden_act",
               f"activation {vision['hidden_act']!r}")  # fmt: skip
    tokens = int(config.get("mm_tokens_per_image") or 256)
    side = int(vision["image_size"]) // int(vision["patch_size"])
    per_side = math.isqrt(tokens)
    _refuse_if(per_side**2 != tokens or side % per_side, "mm_tokens_per_image",
               f"{tokens} tokens from a {side} x {side} patch grid")  # fmt: skip
    tower = VisionConfig(
        depth=int(vision["num_hidden_layers"]),
        hidden_size=int(vision["hidden_size"]),
        num_heads=int(vision["num_attention_heads"]),
        intermediate_size=int(vision["intermediate_size"]),
        out_hidden_size=int(config["hidden_size"]),
        patch_size=int(vision["patch_size"]),
        spatial_merge_size=side // per_side,
        in_channels=int(vision["num_channels"]),
        hidden_act="gelu_tanh",
        image_token_id=_image_token(config),
        image_size=int(vision["image_size"]),
        tokens_per_image=tokens,
        layer_norm_eps=float(vision["layer_norm_eps"]),
    )
    return {**_gemma3(config), "vision": tower}


def _image_token(config: Config) -> int:
    return int(config.get("image_token_index") or config.get("image_token_id") or 262_144)


# transformers' SiglipVisionConfig and Gemma3TextConfig defaults: Gemma 3's config.json leaves
# out the fields that keep them.
_SIGLIP_DEFAULTS: Config = {
    "model_type": "siglip_vision_model", "hidden_size": 768, "intermediate_size": 3072,
    "num_hidden_layers": 12, "num_attention_heads": 12, "num_channels": 3, "image_size": 224,
    "patch_size": 16, "hidden_act": "gelu_pytorch_tanh", "layer_norm_eps": 1e-6,
}  # fmt: skip
_TEXT_DEFAULTS: dict[str, Config] = {
    "gemma3": {
        "vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216,
        "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
        "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6,
        "max_position_embeddings": 131_072, "query_pre_attn_scalar": 256,
        "sliding_window": 4096, "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0,
    },
}  # fmt: skip
VISION_FAMILIES = frozenset({"qwen2_5_vl", "gemma3"})
"""Families whose config.json nests the language model's fields under text_config."""


def _experts(config: Config) -> dict[str, Any]:
    num = config.get("num_experts") or config.get("num_local_experts") or 0
    step = int(config.get("decoder_sparse_step", 1) or 1)
    only_dense = set(config.get("mlp_only_layers") or ())
    dense = tuple(
        i for i in range(config["num_hidden_layers"]) if i in only_dense or (i + 1) % step
    )
    return {
        "num_experts": int(num),
        "num_experts_per_tok": int(config["num_experts_per_tok"]),
        "norm_topk_prob": bool(config.get("norm_topk_prob", False)),
        "moe_intermediate_size": int(config.get("moe_intermediate_size") or 0),
        "dense_layers": dense,
    }


def _qwen3_moe(config: Config) -> dict[str, Any]:
    return {**_qwen3(config), **_experts(config)}


def _qwen2_moe(config: Config) -> dict[str, Any]:
    shared = int(config.get("shared_expert_intermediate_size") or 0)
    return {**_qwen2(config), **_experts(config), "shared_expert_intermediate_size": shared}


def _mixtral(config: Config) -> dict[str, Any]:
    experts = _experts(config)
    # Mixtral's router always renormalizes its top-k; its experts are intermediate_size wide.
    experts |= {"norm_topk_prob": True, "moe_intermediate_size": int(config["intermediate_size"])}
    return {**_mistral(config), **experts}


def _gemma_common(config: Config, types: tuple[str, ...]) -> dict[str, Any]:
    # Gemma 3 embedding checkpoints (EmbeddingGemma) attend both ways, windows included.
    _refuse_if(config.get("use_bidirectional_attention"), "use_bidirectional_attention",
               "bidirectional attention")  # fmt: skip
    bias = bool(config.get("attention_bias", False))  # q/k/v and o_proj, as Llama's
    return {
        "attention_bias": bias,
        "o_proj_bias": bias,
        "norm_offset": 1.0,
        "embed_scale": math.sqrt(config["hidden_size"]),
        "sandwich_norms": True,
        "query_pre_attn_scalar": float(config.get("query_pre_attn_scalar") or 0.0),
        "attn_logit_softcap": float(config.get("attn_logit_softcapping") or 0.0),
        "final_logit_softcap": float(config.get("final_logit_softcapping") or 0.0),
        "sliding_window": _window(config, types),
        "layer_types": types,
        "tie_word_embeddings": bool(config.get("tie_word_embeddings", True)),
    }


def _gemma2(config: Config) -> dict[str, Any]:
    types = _layer_types(config, lambda i: i % 2 == 0)
    return _gemma_common(config, types)


def _gemma3(config: Config) -> dict[str, Any]:
    pattern = int(
        config.get("sliding_window_pattern") or config.get("_sliding_window_pattern") or 6
    )
    types = _layer_types(config, lambda i: (i + 1) % pattern != 0)
    params = config.get("rope_parameters") or {}
    if FULL in params:  # transformers >= 5: one rope per layer type
        theta, scaling = _rope(params[FULL], None)
        local_theta, local_scaling = _rope(params.get(SLIDING), None)
        _refuse_if(local_scaling, "rope_parameters.sliding_attention", "a scaled local rope")
    else:
        theta, scaling = _rope(config.get("rope_scaling"), config.get("rope_theta", 1e6))
        local_theta = float(config.get("rope_local_base_freq", 10000.0))
    common = _gemma_common(config, types)
    return {**common, "qk_norm": True, "rope_theta": theta, "rope_scaling": scaling,
            "local_rope_theta": local_theta}  # fmt: skip


def _phi3(config: Config) -> dict[str, Any]:
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    factor = params.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0))
    _refuse_if(factor != 1.0, "partial_rotary_factor", f"partial rotary ({factor})")
    theta, scaling = _rope(config.get("rope_parameters") or config.get("rope_scaling"),
                           config.get("rope_theta"))  # fmt: skip
    if scaling is not None and scaling["rope_type"] == "longrope":
        original = scaling.get("original_max_position_embeddings")
        original = original or config.get("original_max_position_embeddings")
        max_pos = config["max_position_embeddings"]
        scaling = {**scaling, "original_max_position_embeddings": original,
                   "max_position_embeddings": max_pos}  # fmt: skip
    return {"rope_theta": theta, "rope_scaling": scaling, **_mistral(config)}


_GEMMA_NORMS = {
    "post_attention_layernorm.weight": "post_attn_norm.weight",
    "pre_feedforward_layernorm.weight": "post_attention_layernorm.weight",
    "post_feedforward_layernorm.weight": "post_mlp_norm.weight",
}
FAMILIES: dict[str, Family] = {
    "llama": Family(_llama),
    "mistral": Family(_mistral),
    "qwen2": Family(_qwen2),
    "qwen3": Family(_qwen3),
    "qwen2_moe": Family(_qwen2_moe),
    "qwen3_moe": Family(_qwen3_moe),
    "mixtral": Family(_mixtral),
    "gemma2": Family(_gemma2, _GEMMA_NORMS),
    "gemma3_text": Family(_gemma3, _GEMMA_NORMS),
    "phi3": Family(_phi3),
    "qwen2_5_vl": Family(_qwen2_5_vl),
    "gemma3": Family(_gemma3_vl, _GEMMA_NORMS),
}


# Encoder-only (BERT-family) model types: bidirectional attention and absolute positions, which
# the paged decoder does not run; named so the refusal says what they are.
ENCODER_ONLY = frozenset({
    "bert", "roberta", "xlm-roberta", "distilbert", "deberta", "deberta-v2", "electra",
    "mpnet", "nomic_bert", "new", "modernbert", "jina-bert-v2", "nomic-bert", "camembert",
})  # fmt: skip


def refuse_encoder_only(architecture: str) -> None:
    if architecture.lower() in ENCODER_ONLY:
        raise ValueError(
            f"{architecture!r} is an encoder-only (BERT-family) model: pagedserve runs "
            "decoder-only models, embedders included (e.g. Qwen3-Embedding, gte-Qwen2); "
            "serve encoder-only embedders with sentence-transformers or text-embeddings-inference"
        )


def family(architecture: str) -> Family:
    refuse_encoder_only(architecture)
    if architecture not in FAMILIES:
        raise ValueError(
            f"architecture {architecture!r} is not supported (supported: {', '.join(FAMILIES)})"
        )
    return FAMILIES[architecture]


def arch_from_hf_config(config: Config) -> ArchConfig:
    """An ArchConfig from the dict of an HF config.json."""
    model_type = config.get("model_type")
    if model_type is None:
        raise ValueError("config.json has no model_type")
    if model_type in VISION_FAMILIES and isinstance(config.get("text_config"), dict):
        defaults = _TEXT_DEFAULTS.get(model_type, {})
        config = {**defaults, **config, **config["text_config"], "model_type": model_type}
    extra = family(model_type).fields(config)
    num_heads = int(config["num_attention_heads"])
    hidden = int(config["hidden_size"])
    rope_theta, rope_scaling = _rope(
        config.get("rope_parameters") or config.get("rope_scaling"), config.get("rope_theta")
    )
    common = dict(
        architecture=model_type,
        vocab_size=int(config["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(config.get("intermediate_size") or 0),
        num_layers=int(config["num_hidden_layers"]),
        num_heads=num_heads,
        num_kv_heads=int(config.get("num_key_value_heads") or num_heads),
        head_size=int(config.get("head_dim") or hidden // num_heads),
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        max_position_embeddings=int(config.get("max_position_embeddings", 2048)),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        attention_bias=False,
        hidden_act=_activation(config),
    )
    return ArchConfig(**{**common, **extra})
