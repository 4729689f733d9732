"""KV cache sizing: how many pages a memory budget holds. Integers only (no torch here).

The tensors themselves are allocated by the model runner (the only owner of device memory);
their layout is defined in core/attention/base.py.
"""

from __future__ import annotations

from dataclasses import dataclass

GiB = 1 << 30


@dataclass(frozen=True)
class KVCacheSpec:
    num_layers: int
    num_kv_heads: int
    head_size: int
    page_size: int
    dtype_bytes: int
    scale_bytes: int = 0
    """Bytes of the scale stored after each token's row of one KV head (int8 caches: 4)."""
    dtype_name: str = ""
    """The cache's dtype as the start-up line names it (e.g. bfloat16, int8)."""

    @property
    def bytes_per_token(self) -> int:
        # K and V, every layer.
        row = self.head_size * self.dtype_bytes + self.scale_bytes
        return 2 * self.num_layers * self.num_kv_heads * row

    @property
    def bytes_per_page(self) -> int:
        return self.bytes_per_token * self.page_size

    def num_pages_for(self, budget_bytes: int) -> int:
        return budget_bytes // self.bytes_per_page


@dataclass(frozen=True)
class KVCacheLayout:
    """What was allocated, as reported at start-up and by /metrics."""

    spec: KVCacheSpec
    num_pages: int

    @property
    def num_tokens(self) -> int:
        return self.num_pages * self.spec.page_size

    @property
    def num_bytes(self) -> int:
        return self.num_pages * self.spec.bytes_per_page

    def describe(self) -> str:
        dtype = f"{self.spec.dtype_name}, " if self.spec.dtype_name else ""
        return (
            f"KV cache: {self.num_pages} pages x {self.spec.page_size} tokens = "
            f"{self.num_tokens} tokens ({dtype}{self.num_bytes / GiB:.2f} GiB)"
        )


def choose_num_pages(spec: KVCacheSpec, budget_bytes: int, min_pages_needed: int) -> int:
    """Pages that fit the budget; a clear error when not even one full-length request fits."""
    num_pages = spec.num_pages_for(budget_bytes)
    if num_pages < min_pages_needed:
        raise ValueError(
            f"kv_cache_memory: {budget_bytes / GiB:.3f} GiB holds {num_pages} pages of "
            f"{spec.page_size} tokens, fewer than the {min_pages_needed} that one request of "
            "max_model_len needs; raise the budget or lower max_model_len"
        )
    return num_pages


def resolve_max_model_len(requested: int | None, max_positions: int) -> int:
    """--max-model-len, or the model's max_position_embeddings when not given; never beyond it."""
    if requested is None:
        return max_positions
    if requested > max_positions:
        raise ValueError(
            f"max_model_len: {requested} exceeds the model's {max_positions} positions"
        )
    return requested


def size_kv_cache(
    spec: KVCacheSpec, max_model_len: int, budget_bytes: int, num_pages: int | None = None
) -> KVCacheLayout:
    """The KV cache's size: `num_pages` when given (--num-pages), else as many pages as the
    budget holds, and never fewer than one request of max_model_len needs."""
    pages_per_request = -(-max_model_len // spec.page_size)
    return KVCacheLayout(spec, num_pages or choose_num_pages(spec, budget_bytes, pages_per_request))
