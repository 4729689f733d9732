"""Torch custom ops over the native paged-attention kernels (namespace `pagedserve`).

The one wrapper of the kernels in pagedserve._core (CPU) and pagedserve._cuda (CUDA): it checks
the tensors (ValueError naming the argument), passes raw pointers, sizes and strides, and
dispatches by device. Fake implementations let torch.compile and opcheck trace the ops.

    reshape_and_cache(key, value, kv_cache, slot_mapping)   # mutates kv_cache
    paged_attention(out, query, kv_cache, page_table, seq_lens, query_start_loc, max_query_len,
                    max_seq_len, scale, sliding_window=0, logit_softcap=0.0,
                    batch_invariant=True)

sliding_window > 0: the query at position i sees key j iff j <= i and i - j < sliding_window;
logit_softcap > 0: scores = logit_softcap * tanh(scores / logit_softcap) before the softmax
(Hugging Face's Mistral / Gemma 2 conventions; 0 turns either off). batch_invariant=False lets
the CPU kernel score a decode step's few query vectors by a faster per-key dot that rounds
differently from a prefill chunk's scoring (issue 16; CUDA ignores it). An int8 or fp8 e4m3
kv_cache (the layout in attention/base.py), or a float16 one on the CPU, takes float32 or
bfloat16 rows (on CUDA float16 ones too): reshape_and_cache quantizes or rounds them,
paged_attention widens them back.

Both are NativeOps (ops/base.py): registered as torch.ops.pagedserve.*, their bodies called
straight by eager code.
"""

from __future__ import annotations

import math

import torch

from pagedserve.core.attention.base import (
    KV_8BIT,
    KV_CPU_ONLY,
    KV_CUDA_OTHER,
    KV_SCALE_BYTES,
    kv_head_size,
)
from pagedserve.core.ops import native
from pagedserve.core.ops.base import CPU_DTYPES, DTYPES, NativeOp, check_rows
from pagedserve.core.ops.native import require

_core = native.core


def _check_cache(kv_cache: torch.Tensor) -> None:
    shape = kv_cache.shape
    require(len(shape) == 5 and shape[0] == 2,
             "kv_cache must be [2, num_pages, num_kv_heads, page_size, row_size], got {}",
             tuple(shape))  # fmt: skip
    require(kv_cache.is_contiguous(), "kv_cache must be contiguous")
    device = kv_cache.device.type
    require(device in ("cpu", "cuda"), "kv_cache must be on cpu or cuda, got {}", device)
    allowed = (*CPU_DTYPES, *KV_CPU_ONLY) if device == "cpu" else (*DTYPES, *KV_CUDA_OTHER)
    require(kv_cache.dtype in allowed, "kv_cache dtype {} is not supported on {} (supported: {})",
             kv_cache.dtype, device, allowed)  # fmt: skip
    require(kv_cache.dtype not in KV_8BIT or shape[4] > KV_SCALE_BYTES,
             "an 8-bit kv_cache's rows must hold head_size values and {} scale bytes, got {}",
             KV_SCALE_BYTES, shape[4])  # fmt: skip


def _check_rows(
    name: str, t: torch.Tensor, kv_cache: torch.Tensor, heads: int | None, like: torch.Tensor
) -> None:
    """t: [num_tokens, heads, head_size], last dim contiguous, on kv_cache's device, in its dtype
    (an 8-bit or CPU float16 cache: in like's, float32 or bfloat16, or on CUDA float16 too)."""
    head_size = kv_head_size(kv_cache)
    if kv_quant(kv_cache) == _core.KvQuant.none:
        check_rows(name, t, kv_cache, "kv_cache", heads=heads, head_size=head_size)
        return
    name = str(kv_cache.dtype).removeprefix("torch.")
    stored = f"an {name}" if name == "int8" else f"a {name}"
    activations = CPU_DTYPES if kv_cache.device.type == "cpu" else tuple(DTYPES)
    require(like.dtype in activations, "{} dtype {} is not supported with {} kv_cache "
             "(supported: {})", name, like.dtype, stored, activations)  # fmt: skip
    require(t.device == kv_cache.device, "{} is on {}, kv_cache on {}", name, t.device,
             kv_cache.device)  # fmt: skip
    check_rows(name, t, like, "the other rows", heads=heads, head_size=head_size)


def check_index(
    name: str, t: torch.Tensor, dtype: torch.dtype, shape: tuple[int, ...], device: torch.device
) -> None:
    """An index tensor of the metadata (also checked once per step by models/decoder_stack/ops.py)."""
    require(t.dtype == dtype, "{} must be {}, got {}", name, dtype, t.dtype)
    require(t.shape == shape, "{} must have shape {}, got {}", name, shape, tuple(t.shape))
    require(t.device == device, "{} is on {}, kv_cache on {}", name, t.device, device)
    require(t.stride(-1) == 1 or t.shape[-1] <= 1, "{} must be contiguous in its last dim", name)
    require(t.dim() != 1 or t.is_contiguous(), "{} must be contiguous", name)


def _check_write(
    key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    _check_cache(kv_cache)
    _check_rows("key", key, kv_cache, kv_cache.shape[2], key)
    _check_rows("value", value, kv_cache, kv_cache.shape[2], key)
    require(key.shape == value.shape, "key and value must have the same shape")
    check_index("slot_mapping", slot_mapping, torch.int64, (key.shape[0],), kv_cache.device)


def _check_attention(
    out: torch.Tensor,
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    max_query_len: int,
    max_seq_len: int,
    scale: float,
    sliding_window: int = 0,
    logit_softcap: float = 0.0,
    batch_invariant: bool = True,
) -> None:
    _check_cache(kv_cache)
    _check_rows("query", query, kv_cache, None, query)
    num_heads, num_kv_heads = query.shape[1], kv_cache.shape[2]
    require(num_heads % num_kv_heads == 0,
             "query heads ({}) must be a multiple of kv_cache heads ({})", num_heads,
             num_kv_heads)  # fmt: skip
    _check_rows("out", out, kv_cache, None, query)
    require(out.shape == query.shape, "out shape {} != query's", tuple(out.shape))
    require(page_table.dim() == 2, "page_table must be 2-D, got {}", tuple(page_table.shape))
    num_reqs = page_table.shape[0]
    device = kv_cache.device
    check_index("page_table", page_table, torch.int32, page_table.shape, device)
    check_index("seq_lens", seq_lens, torch.int32, (num_reqs,), device)
    check_index("query_start_loc", query_start_loc, torch.int32, (num_reqs + 1,), device)
    require(max_query_len >= 0, "max_query_len must be >= 0, got {}", max_query_len)
    require(max_seq_len >= max_query_len, "max_seq_len must be >= max_query_len")
    require(math.isfinite(scale), "scale must be finite, got {}", scale)
    require(sliding_window >= 0, "sliding_window must be >= 0, got {}", sliding_window)
    require(math.isfinite(logit_softcap) and logit_softcap >= 0,
             "logit_softcap must be finite and >= 0, got {}", logit_softcap)  # fmt: skip


def cpu_attention_path() -> str:
    """The CPU kernels paged_attention runs at the active ISA level: portable, avx2, avx512 or
    avx512_bf16 (ops/cpu_features.py)."""
    return str(_core.paged_attention_cpu_path())


def page_table_stride(page_table: torch.Tensor) -> int:
    """The elements between rows, which the kernels read as each row's capacity. A single row's
    stride is arbitrary (e.g. a transposed view): its width is its capacity then."""
    rows, width = page_table.shape
    return page_table.stride(0) if rows > 1 else width


def kv_quant(kv_cache: torch.Tensor) -> _core.KvQuant:
    """How the kernels read kv_cache: in the activations' dtype (none), as int8 or e4m3 rows
    with their scales, or as float16 under float32 or bfloat16 activations (a CPU cache; float16
    activations, CUDA's, keep a float16 cache as it is)."""
    if kv_cache.dtype == torch.int8:
        return _core.KvQuant.int8
    if kv_cache.dtype == torch.float8_e4m3fn:
        return _core.KvQuant.fp8_e4m3
    if kv_cache.dtype == torch.float16 and kv_cache.device.type == "cpu":
        return _core.KvQuant.fp16
    return _core.KvQuant.none


def _cache_view(kv_cache: torch.Tensor) -> _core.KvCacheView:
    view = _core.KvCacheView()
    view.data = kv_cache.data_ptr()
    view.num_pages, view.num_kv_heads, view.page_size = kv_cache.shape[1:4]
    view.head_size = kv_head_size(kv_cache)
    view.quant = kv_quant(kv_cache)
    return view


def _token_tensor(t: torch.Tensor) -> _core.TokenTensor:
    view = _core.TokenTensor()
    view.data = t.data_ptr()
    view.token_stride, view.head_stride = t.stride(0), t.stride(1)
    return view


def _stream(t: torch.Tensor) -> int:
    return torch.cuda.current_stream(t.device).cuda_stream


def _cuda_module() -> native.CudaKernels:
    if native.cuda is None:
        raise RuntimeError("pagedserve was built without CUDA kernels (pagedserve._cuda missing)")
    return native.cuda


def reshape_and_cache_eager(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_size]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_size]
    kv_cache: torch.Tensor,  # [2, num_pages, num_kv_heads, page_size, row_size]
    slot_mapping: torch.Tensor,  # [num_tokens] int64, -1 = skip
) -> None:
    """reshape_and_cache's body."""
    _check_write(key, value, kv_cache, slot_mapping)
    args = _core.CacheWriteArgs()
    args.key, args.value = _token_tensor(key), _token_tensor(value)
    args.cache = _cache_view(kv_cache)
    args.slot_mapping = slot_mapping.data_ptr()
    args.num_tokens = key.shape[0]
    args.dtype = DTYPES[key.dtype]
    if kv_cache.is_cuda:
        with torch.cuda.device(kv_cache.device):  # kernels launch on the current device
            _cuda_module().reshape_and_cache(args, _stream(kv_cache))
    else:
        _core.reshape_and_cache(args, torch.get_num_threads())


reshape_and_cache = NativeOp.declare(
    "reshape_and_cache", reshape_and_cache_eager, _check_write, mutates=("kv_cache",)
)


def _attention_args(
    out: torch.Tensor,
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    max_query_len: int,
    max_seq_len: int,
    scale: float,
    sliding_window: int,
    logit_softcap: float,
    batch_invariant: bool,
) -> _core.AttentionArgs:
    args = _core.AttentionArgs()
    args.out = out.data_ptr()
    args.out_token_stride, args.out_head_stride = out.stride(0), out.stride(1)
    args.query = _token_tensor(query)
    args.cache = _cache_view(kv_cache)
    args.page_table = page_table.data_ptr()
    args.page_table_stride = page_table_stride(page_table)
    args.seq_lens = seq_lens.data_ptr()
    args.query_start_loc = query_start_loc.data_ptr()
    args.num_reqs, args.num_tokens, args.num_heads = page_table.shape[0], *query.shape[:2]
    args.max_query_len, args.max_seq_len = max_query_len, max_seq_len
    args.scale = scale
    args.sliding_window, args.logit_softcap = sliding_window, logit_softcap
    args.batch_invariant = batch_invariant
    args.dtype = DTYPES[query.dtype]
    return args


def _cuda_attention(args: _core.AttentionArgs, query: torch.Tensor) -> None:
    cuda = _cuda_module()
    splits = 1
    if args.max_query_len == 1:  # decode: split long contexts across thread blocks
        splits = max(1, -(-args.max_seq_len // cuda.DECODE_SPLIT_LEN))
    workspace_ptr = 0
    if splits > 1:
        size = args.num_tokens * args.num_heads * splits * (args.cache.head_size + 2)
        workspace = torch.empty(size, dtype=torch.float32, device=query.device)
        workspace_ptr = workspace.data_ptr()  # the caching allocator keeps it stream-ordered
    cuda.paged_attention(args, workspace_ptr, splits, _stream(query))


def paged_attention_eager(
    out: torch.Tensor,  # [num_tokens, num_heads, head_size]
    query: torch.Tensor,  # [num_tokens, num_heads, head_size]
    kv_cache: torch.Tensor,  # [2, num_pages, num_kv_heads, page_size, row_size]
    page_table: torch.Tensor,  # [num_reqs, max_pages_per_req] int32
    seq_lens: torch.Tensor,  # [num_reqs] int32
    query_start_loc: torch.Tensor,  # [num_reqs + 1] int32
    max_query_len: int,
    max_seq_len: int,
    scale: float,
    sliding_window: int = 0,  # 0: none
    logit_softcap: float = 0.0,  # 0: none
    batch_invariant: bool = True,  # False: the faster, not batch-invariant CPU decode scoring
) -> None:
    """paged_attention's body."""
    params = (out, query, kv_cache, page_table, seq_lens, query_start_loc, max_query_len,
              max_seq_len, scale, sliding_window, logit_softcap, batch_invariant)  # fmt: skip
    _check_attention(*params)
    args = _attention_args(*params)
    if kv_cache.is_cuda:
        with torch.cuda.device(kv_cache.device):
            _cuda_attention(args, query)
    else:
        _core.paged_attention(args, torch.get_num_threads())


paged_attention = NativeOp.declare(
    "paged_attention", paged_attention_eager, _check_attention, mutates=("out",)
)
