"""Attention backends by name, chosen from a plain dict (config: ModelConfig.attention_backend)."""

from __future__ import annotations

from pagedserve.core.attention.base import AttentionBackend
from pagedserve.core.attention.native import NativeAttentionBackend
from pagedserve.core.attention.reference import TorchReferenceBackend

_BACKENDS: dict[str, type[AttentionBackend]] = {
    "native": NativeAttentionBackend,
    "torch": TorchReferenceBackend,
}
_DEFAULT = "native"  # what "auto" means: the native kernels, on CPU and CUDA alike


def get_attention_backend(name: str, deterministic: bool = True) -> AttentionBackend:
    """A fresh backend for `name`: "auto", "native" or "torch". deterministic=False lets the
    native kernels give up batch invariance for speed (the others ignore it)."""
    key = _DEFAULT if name == "auto" else name
    if key not in _BACKENDS:
        choices = ", ".join(["auto", *_BACKENDS])
        raise ValueError(f"attention_backend must be one of {choices}, got {name!r}")
    if key == "native":
        return NativeAttentionBackend(batch_invariant=deterministic)
    return _BACKENDS[key]()
