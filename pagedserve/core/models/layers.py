"""Building blocks shared by the model families: rotary tables and the fused rotary op.

Rotary uses HF's rotate-half (NeoX) form: a head's dims i and i + head_size/2 form one pair.
GGUF Llama weights are stored for the interleaved form; the GGUF loader undoes that, so this one
form serves every format.
"""

from __future__ import annotations

import math
from typing import Any

import torch


def rope_inv_freq(
    head_size: int, theta: float, rope_scaling: dict[str, Any] | None, max_positions: int = 0
) -> torch.Tensor:
    """[head_size // 2] float32 inverse frequencies, after any rope scaling.

    max_positions (the context served) picks longrope's long factors when it exceeds the
    original context, as llama.cpp does (transformers picks by the current sequence length,
    which agrees whenever a sequence stays on one side of the original context)."""
    # Explicit device="cpu": models are built under torch.device("meta"), the tables must be real.
    exponents = torch.arange(0, head_size, 2, dtype=torch.int64, device="cpu").float() / head_size
    inv_freq = 1.0 / (theta**exponents)
    if rope_scaling is None:
        return inv_freq
    rope_type = rope_scaling.get("rope_type", rope_scaling.get("type"))
    if rope_type == "linear":
        return inv_freq / float(rope_scaling["factor"])
    if rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, rope_scaling)
    if rope_type == "longrope":
        long = max_positions > int(rope_scaling["original_max_position_embeddings"])
        factors = rope_scaling["long_factor" if long else "short_factor"]
        return inv_freq / torch.tensor(factors, dtype=torch.float32, device="cpu")
    if rope_type == "freq_factors":
        return inv_freq / torch.tensor(rope_scaling["factors"], dtype=torch.float32, device="cpu")
    raise ValueError(f"rope_scaling type {rope_type!r} is not supported")


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict[str, Any]) -> torch.Tensor:
    """Llama 3.1 scaling: long wavelengths are slowed by `factor`, short ones kept, and the band
    in between blends the two linearly in 1/wavelength."""
    factor = float(scaling["factor"])
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    old_len = float(scaling["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    blend = (old_len / wavelen - low) / (high - low)  # in [0, 1] inside the middle band
    scaled = (1 - blend) * inv_freq / factor + blend * inv_freq
    long = wavelen > old_len / low
    short = wavelen < old_len / high
    return torch.where(long, inv_freq / factor, torch.where(short, inv_freq, scaled))


def rope_attention_factor(rope_scaling: dict[str, Any] | None) -> float:
    """The factor longrope multiplies cos and sin by (1 for every other rope)."""
    if rope_scaling is None or rope_scaling.get("rope_type") != "longrope":
        return 1.0
    if rope_scaling.get("attention_factor") is not None:
        return float(rope_scaling["attention_factor"])
    original = float(rope_scaling["original_max_position_embeddings"])
    factor = rope_scaling.get("factor") or rope_scaling["max_position_embeddings"] / original
    return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))


def rope_tables(
    inv_freq: torch.Tensor,
    max_positions: int,
    dtype: torch.dtype,
    device: torch.device,
    attention_factor: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, signed_sin), each [max_positions, head_size] in `dtype`.

    signed_sin is [-sin, sin] over the two halves, so that with roll(x, half) == [x2, x1]
    rotate_half(x) * sin == roll(x) * signed_sin, and rotary is one addcmul (see apply_rotary).
    """
    positions = torch.arange(max_positions, dtype=torch.int64, device="cpu").float()
    freqs = torch.outer(positions, inv_freq.float())  # [max_positions, head_size // 2]
    cos, sin = freqs.cos(), freqs.sin()
    if attention_factor != 1.0:
        cos, sin = cos * attention_factor, sin * attention_factor
    cos_full = torch.cat((cos, cos), dim=-1)
    signed_sin = torch.cat((-sin, sin), dim=-1)
    return cos_full.to(device=device, dtype=dtype), signed_sin.to(device=device, dtype=dtype)
