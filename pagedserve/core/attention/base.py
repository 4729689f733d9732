"""Attention backends: the paged KV layout, the per-step metadata, and the base class.

KV page layout (mirrored in cpp/include/pagedserve/paged_attention.hpp; a test checks both):
one tensor per layer,

    kv_cache[layer]: [2, num_pages, num_kv_heads, page_size, row_size]   (0 = K, 1 = V)

so the keys of one page and one KV head are a contiguous page_size x row_size tile. In the
activations' dtype row_size = head_size. An int8 cache (--kv-cache-dtype int8) stores each
token's row of one KV head as head_size int8 values followed by the 4 bytes of their float32
scale, row_size = head_size + KV_SCALE_BYTES: x ~= q * scale with scale = max|x| / 127 over the
row (0 for an all-zero row) and q = round-half-even(x / scale) in [-127, 127], quantized as the
rows are written and widened to fp32 as the kernels read them. An fp8 cache (--kv-cache-dtype
fp8_e4m3, or vLLM's fp8; torch.float8_e4m3fn tensors) has the same layout with e4m3 values:
scale = max|x| / 448, values (x / scale) rounded to nearest even as e4m3 (saturating at +-448).
Token slot s lives in page
s // page_size at offset s % page_size; slot -1 means "do not write".

A batch mixes prefill chunks and decodes. Request r owns query rows
query_start_loc[r] : query_start_loc[r + 1]; its q_len = those rows, its seq_len counts every
token in its context after this step, so query row i sits at position seq_len - q_len + i and
attends causally to positions 0 .. that position.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

KV_CACHE_DIMS = ("kv", "num_pages", "num_kv_heads", "page_size", "row_size")
KV_SCALE_BYTES = 4
"""The float32 scale after each 8-bit row."""
KV_8BIT = (torch.int8, torch.float8_e4m3fn)
"""Cache dtypes whose rows are 8-bit values and their scale."""
KV_CPU_ONLY = (*KV_8BIT, torch.float16)
"""Cache dtypes the CPU kernels read under other activations (float16: under fp32 or bf16)."""
KV_CUDA_OTHER = KV_8BIT
"""Cache dtypes the CUDA kernels read under other activations (any of fp32, bf16, fp16)."""
KV_CACHE_DTYPES: dict[str, torch.dtype | None] = {
    "auto": None,  # the model's dtype
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp32": torch.float32,
    "int8": torch.int8,
    "fp8": torch.float8_e4m3fn,  # vLLM's fp8: e4m3
    "fp8_e4m3": torch.float8_e4m3fn,
}
"""--kv-cache-dtype's names (vLLM's) and the cache tensors' torch dtype."""


def kv_cache_dtype(name: str, model_dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The KV cache tensors' dtype for --kv-cache-dtype `name`: the model's dtype (auto, or the
    same dtype named), int8 or fp8 e4m3 (CPU and CUDA), or on the CPU fp16 under a float32 or
    bfloat16 model. A clear ValueError for the rest: the kernels read caches in the activations'
    dtype, in int8 or fp8, or (CPU) in fp16."""
    if name not in KV_CACHE_DTYPES:
        raise ValueError(
            f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {name!r}"
        )
    dtype = KV_CACHE_DTYPES[name] or model_dtype
    if dtype == model_dtype:
        return dtype
    if dtype in KV_CPU_ONLY and device.type != "cpu" and dtype not in KV_CUDA_OTHER:
        raise ValueError(
            f"kv_cache_dtype {name} under a {str(model_dtype).removeprefix('torch.')} model "
            f"runs on the CPU kernels only; on {device.type} use auto"
        )
    if dtype not in KV_CPU_ONLY:
        raise ValueError(
            f"kv_cache_dtype {name} differs from the model's dtype "
            f"{str(model_dtype).removeprefix('torch.')}: use auto, int8, fp8_e4m3, fp16 or the "
            "model's dtype"
        )
    return dtype


def kv_row_size(head_size: int, dtype: torch.dtype) -> int:
    """The last dim of a cache in `dtype`: head_size, or head_size + KV_SCALE_BYTES for an
    8-bit cache."""
    return head_size + KV_SCALE_BYTES if dtype in KV_8BIT else head_size


def kv_head_size(kv_cache: torch.Tensor) -> int:
    """The head size of a cache tensor (its row size less an 8-bit row's scale bytes)."""
    return int(kv_cache.shape[4]) - (KV_SCALE_BYTES if kv_cache.dtype in KV_8BIT else 0)


def kv_cache_shape(
    num_pages: int,
    page_size: int,
    num_kv_heads: int,
    head_size: int,
    dtype: torch.dtype | None = None,  # 8-bit: rows with their scales; else the model's dtype
) -> tuple[int, int, int, int, int]:
    row_size = kv_row_size(head_size, dtype) if dtype is not None else head_size
    return (2, num_pages, num_kv_heads, page_size, row_size)


@dataclass
class AttentionMetadata:
    """Per-step inputs shared by every layer, on the model's device."""

    slot_mapping: torch.Tensor  # [num_tokens] int64, -1 = skip
    page_table: torch.Tensor  # [num_reqs, max_pages_per_req] int32
    seq_lens: torch.Tensor  # [num_reqs] int32
    query_start_loc: torch.Tensor  # [num_reqs + 1] int32
    max_query_len: int
    max_seq_len: int

    @property
    def num_reqs(self) -> int:
        return int(self.seq_lens.shape[0])

    @property
    def is_pure_decode(self) -> bool:
        return self.max_query_len == 1


class AttentionBackend(ABC):
    """Writes this step's K/V into the paged cache, then attends over it."""

    name: str
    native_decoder_stack: bool = False
    batch_invariant: bool = True
    """Each query's output is fixed by its own position and keys alone, whatever shares the
    call (a kernel property; the native backend can trade it for speed, --no-deterministic)."""
    """Its kernels are the ones models/decoder_stack/ops.py calls, so a model may run all its layers in
    that one native call instead of calling forward() layer by layer."""

    @abstractmethod
    def forward(
        self,
        query: torch.Tensor,  # [num_tokens, num_heads, head_size]
        key: torch.Tensor,  # [num_tokens, num_kv_heads, head_size]
        value: torch.Tensor,  # [num_tokens, num_kv_heads, head_size]
        kv_cache: torch.Tensor,  # [2, num_pages, num_kv_heads, page_size, row_size]
        meta: AttentionMetadata,
        scale: float,
        sliding_window: int = 0,  # > 0: a query at position i sees keys j > i - sliding_window
        logit_softcap: float = 0.0,  # > 0: scores = logit_softcap * tanh(scores / logit_softcap)
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_size]
        ...
