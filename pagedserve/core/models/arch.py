"""ArchConfig: the shape of a decoder, read from an HF config.json or from GGUF metadata.

Both loaders produce this one frozen record; the model code reads nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# "mistral" is served as llama: pagedserve does not implement sliding-window attention, and
# a Mistral checkpoint without one is exactly a Llama.
SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "mistral")
# "freq_factors": per-frequency divisors, as GGUF stores Llama 3.1 scaling (rope_freqs.weight).
ROPE_TYPES = ("default", "linear", "llama3", "freq_factors")


@dataclass(frozen=True)
class ArchConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: (
        dict[str, Any] | None
    )  # None, or {"rope_type": one of ROPE_TYPES, ...} as HF writes it
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool  # bias on q/k/v (qwen2 always has one)

    def __post_init__(self) -> None:
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"architecture {self.architecture!r} is not supported "
                f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )
        if self.rope_scaling is not None:
            rope_type = self.rope_scaling.get("rope_type", self.rope_scaling.get("type"))
            if rope_type not in ROPE_TYPES:
                raise ValueError(f"rope_scaling type {rope_type!r} is not supported {ROPE_TYPES}")


def _rope_from_hf(config: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, rope_scaling) from transformers <5 (rope_theta + rope_scaling) or >=5
    (rope_parameters holding both) config.json files."""
    params = config.get("rope_parameters") or config.get("rope_scaling") or None
    theta = config.get("rope_theta")
    if theta is None:
        theta = (params or {}).get("rope_theta", 10000.0)
    if params is not None:
        rope_type = params.get("rope_type", params.get("type", "default"))
        params = None if rope_type == "default" else {**params, "rope_type": rope_type}
    return float(theta), params


def arch_from_hf_config(config: dict[str, Any]) -> ArchConfig:
    """An ArchConfig from the dict of an HF config.json."""
    model_type = config.get("model_type")
    if model_type is None:
        raise ValueError("config.json has no model_type")
    if model_type == "mistral" and config.get("sliding_window"):
        # A window longer than any context we serve is harmless; a shorter one changes outputs.
        if config["sliding_window"] < config.get("max_position_embeddings", 0):
            raise ValueError("mistral with sliding_window is not supported")
    num_heads = int(config["num_attention_heads"])
    hidden = int(config["hidden_size"])
    rope_theta, rope_scaling = _rope_from_hf(config)
    return ArchConfig(
        architecture=model_type,
        vocab_size=int(config["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(config["intermediate_size"]),
        num_layers=int(config["num_hidden_layers"]),
        num_heads=num_heads,
        num_kv_heads=int(config.get("num_key_value_heads") or num_heads),
        head_size=int(config.get("head_dim") or hidden // num_heads),
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        max_position_embeddings=int(config.get("max_position_embeddings", 2048)),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        attention_bias=model_type == "qwen2" or bool(config.get("attention_bias", False)),
    )
