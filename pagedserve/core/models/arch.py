"""ArchConfig: the shape of a decoder, read from an HF config.json or from GGUF metadata.

Both loaders produce this one frozen record; the model code reads nothing else. Which HF
`model_type` fills which field lives in families.py (one small mapping per family).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# "freq_factors": per-frequency divisors, as GGUF stores Llama 3.1 scaling (rope_freqs.weight).
# "longrope": Phi-3's short/long per-frequency factors ("su" is its older name).
ROPE_TYPES = ("default", "linear", "llama3", "freq_factors", "longrope")
ACTIVATIONS = ("silu", "gelu_tanh")
SLIDING, FULL = "sliding_attention", "full_attention"


@dataclass(frozen=True)
class VisionConfig:
    """A vision tower's shape (Qwen2.5-VL's ViT, Gemma 3's SigLIP), from config.json's
    vision_config."""

    depth: int
    hidden_size: int
    num_heads: int
    intermediate_size: int
    out_hidden_size: int
    """The language model's width: what the projector (merger) writes."""
    patch_size: int = 14
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    """Patches per side of what becomes one token (Qwen's 2 x 2 merger, Gemma 3's pool)."""
    window_size: int = 112
    """Pixels a window-attention block's window spans (full-attention blocks see the image)."""
    fullatt_block_indexes: tuple[int, ...] = ()
    in_channels: int = 3
    hidden_act: str = "silu"
    image_token_id: int = 0
    """The token the chat template writes once per image."""
    image_size: int = 0
    """SigLIP (Gemma 3): the side every image is resized to; 0 for a tower of any size."""
    tokens_per_image: int = 0
    """Gemma 3: every image's tokens in the prompt (mm_tokens_per_image), which attend to
    each other both ways; 0: the image's size decides, and the attention stays causal."""
    layer_norm_eps: float = 1e-6


@dataclass(frozen=True)
class ArchConfig:
    architecture: str
    """The family (HF model_type, e.g. "llama", "qwen3_moe", "gemma2")."""
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    """Width of a dense MLP."""
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    """None, or {"rope_type": one of ROPE_TYPES, ...} as HF writes it."""
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    """Bias on q/k/v (qwen2 always has one)."""
    o_proj_bias: bool = False
    """Bias on the attention output projection (Llama / Qwen3 with attention_bias)."""
    qk_norm: bool = False
    """Per-head RMSNorm of q and k before rotary (Qwen3, Gemma 3)."""
    norm_offset: float = 0.0
    """RMSNorm multiplies by (offset + weight) (Gemma: 1); folded into the weights at load."""
    embed_scale: float = 1.0
    """Embeddings are multiplied by this (Gemma: sqrt(hidden_size), in the model's dtype)."""
    sandwich_norms: bool = False
    """Extra norms on the attention and MLP outputs before each residual add (Gemma 2/3)."""
    hidden_act: str = "silu"
    """The gated MLP's activation: silu (SwiGLU) or gelu_tanh (GeGLU)."""
    query_pre_attn_scalar: float = 0.0
    """Attention scale is this ** -0.5 when set (Gemma), else head_size ** -0.5."""
    attn_logit_softcap: float = 0.0
    """Attention logits become cap * tanh(logit / cap) (Gemma 2); 0 = off."""
    final_logit_softcap: float = 0.0
    """Output logits become cap * tanh(logit / cap) (Gemma 2); 0 = off."""
    sliding_window: int = 0
    """Tokens a sliding layer's query sees (itself included); 0 = no sliding layers."""
    layer_types: tuple[str, ...] = ()
    """Per layer SLIDING or FULL; () means every layer slides when sliding_window is set."""
    local_rope_theta: float = 0.0
    """Rope base of the sliding layers (Gemma 3), unscaled; 0 = the same rope as the others."""
    num_experts: int = 0
    """Routed experts per MoE layer; 0 = a dense model."""
    num_experts_per_tok: int = 0
    norm_topk_prob: bool = False
    """Renormalize the top-k router probabilities to sum to 1 (Mixtral always does)."""
    moe_intermediate_size: int = 0
    dense_layers: tuple[int, ...] = ()
    """Layers of an MoE model that keep a dense MLP (Qwen MoE mlp_only_layers / sparse step)."""
    shared_expert_intermediate_size: int = 0
    """A shared expert behind a sigmoid gate, added to the routed ones (Qwen2-MoE); 0 = none."""
    mrope_section: tuple[int, ...] = ()
    """Multimodal rotary (Qwen2-VL): how many of the head's frequency pairs take the
    temporal, height and width position; () = one position per token."""
    vision: VisionConfig | None = None
    """The vision tower of a model that takes images (None: text only)."""

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )
        if self.rope_scaling is not None:
            rope_type = self.rope_scaling.get("rope_type", self.rope_scaling.get("type"))
            if rope_type not in ROPE_TYPES:
                raise ValueError(f"rope_scaling type {rope_type!r} is not supported {ROPE_TYPES}")
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"hidden_act {self.hidden_act!r} is not supported {ACTIVATIONS}")
        if self.layer_types and len(self.layer_types) != self.num_layers:
            raise ValueError(f"layer_types has {len(self.layer_types)} entries, not num_layers")
        if any(t not in (SLIDING, FULL) for t in self.layer_types):
            raise ValueError(f"layer_types must be {SLIDING!r} or {FULL!r}: {self.layer_types}")
        if self.num_experts and not 0 < self.num_experts_per_tok <= self.num_experts:
            raise ValueError(
                f"num_experts_per_tok ({self.num_experts_per_tok}) must be in "
                f"1..num_experts ({self.num_experts})"
            )

    def is_sliding(self, layer: int) -> bool:
        if not self.sliding_window:
            return False
        return not self.layer_types or self.layer_types[layer] == SLIDING

    def uses_local_rope(self, layer: int) -> bool:
        """A sliding-type layer of a model with a local rope base (whatever the window)."""
        return (
            bool(self.local_rope_theta)
            and bool(self.layer_types)
            and (self.layer_types[layer] == SLIDING)
        )

    def layer_window(self, layer: int) -> int:
        """The layer's sliding window in tokens, 0 for full attention."""
        return self.sliding_window if self.is_sliding(layer) else 0

    def is_moe_layer(self, layer: int) -> bool:
        return self.num_experts > 0 and layer not in self.dense_layers

    @property
    def attn_scale(self) -> float:
        scale: float = (self.query_pre_attn_scalar or self.head_size) ** -0.5
        return scale
