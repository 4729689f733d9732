"""The whole decoder stack in one native call: pagedserve._core.DecoderStack (bf16, or fp32 with
every projection kept quantized; CPU; the KV cache in the stack's dtype, int8 or float16).

    stack = NativeDecoderStack(shape, [core.DecoderLayerWeights(...), ...], owner=layers)
    stack.set_lora([core.DecoderLayerLora(...), ...])          # optional: adapters' stacks
    hidden = stack(hidden, cos, signed_sin, kv_caches, meta, lora)   # in place into hidden

models/decoder_stack/stack.py decides where it applies and gathers each layer's weights.

It runs llama.py's layers kernel for kernel in C++ (RMSNorm, packed qkv, rotary, cache write,
paged attention, o + residual, RMSNorm, gate_up with SiLU-and-mul, down + residual), so the
results are the per-layer path's bit for bit (a test holds them equal); what it saves is the
Python between the ~240 kernel calls of a step: 1.35 s of a 9.4 s offline run here, 1.117x
offline throughput side by side (bench/RESULTS.md). With LoRA stacks set, a step's adapter rows
add their adapter's product to each projection (cpp/src/lora/), as the per-layer path does with
the same kernel: the same bits again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

from pagedserve.core.attention.base import KV_CPU_ONLY, AttentionMetadata, kv_row_size
from pagedserve.core.attention.ops import check_index, kv_quant, page_table_stride
from pagedserve.core.lora.weights import LoraBatch
from pagedserve.core.ops import native
from pagedserve.core.ops.layer_ops import torch_vector_lanes
from pagedserve.core.ops.native import require

_core = native.core


@dataclass(frozen=True, slots=True)
class StackShape:
    """The sizes every layer shares."""

    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_size: int
    intermediate_size: int
    rms_norm_eps: float
    scale: float
    """The attention's softmax scale."""
    batch_invariant: bool = True
    """The attention backend's batch_invariant, for every layer's attention."""
    float32: bool = False
    """The residual stream, norms, rotary tables, activations and an unquantized KV cache are
    fp32 (every projection kept quantized), else bf16."""


class NativeDecoderStack:
    def __init__(
        self, shape: StackShape, layers: Sequence[_core.DecoderLayerWeights], owner: object
    ) -> None:
        """`layers`: each layer's weights, named (data pointers; qkv_bias 0: none; projections
        packed by ops/linear.py). owner keeps every weight they point at alive with the stack."""
        self._owner, self._num_layers = owner, len(layers)
        self.hidden_size, self.head_size = shape.hidden_size, shape.head_size
        self.num_kv_heads, self.batch_invariant = shape.num_kv_heads, shape.batch_invariant
        self.dtype = torch.float32 if shape.float32 else torch.bfloat16
        self.amx_from_rows = 0
        """Steps of at least this many tokens run the bf16 projections on AMX tiles (0: never;
        ops/linear.py's packed_linear)."""
        self.amx_int8_from_rows = 0
        """Likewise the quantized projections on AMX-INT8 tiles (ops/linear_quant.py)."""
        self.amx_tile_order = False
        """Steps below amx_from_rows sum the bf16 projections in the tiles' order."""
        self.quant_float_activations = False
        """The quantized projections keep x in fp32 (ops/linear_quant.py's float_activations)."""
        self.quant_int16_activations = False
        """The quantized projections round x to int16 (ops/linear_quant.py's int16_activations)."""
        # StackShape's fields are the native constructor's keyword arguments, name for name.
        self._native = _core.DecoderStack(**asdict(shape), layers=list(layers))
        self._lora_owner: object = None

    def set_lora(self, layers: Sequence[_core.DecoderLayerLora], owner: object) -> None:
        """The adapters' stacks beside each layer's projections (slots written in place later
        need no new call); owner keeps them alive."""
        self._native.set_lora(list(layers))
        self._lora_owner = owner

    @property
    def has_lora(self) -> bool:
        return bool(self._native.has_lora)

    def __call__(
        self,
        hidden: torch.Tensor,  # [n, hidden_size] self.dtype, the residual stream: in place
        cos: torch.Tensor,  # [n, 1, head_size] self.dtype
        signed_sin: torch.Tensor,  # [n, 1, head_size] self.dtype
        kv_caches: list[torch.Tensor],  # per layer [2, num_pages, num_kv_heads, page_size, row]
        meta: AttentionMetadata,
        lora: LoraBatch | None = None,  # the step's adapter rows (needs set_lora)
    ) -> torch.Tensor:
        self._check(hidden, cos, signed_sin, kv_caches, meta)
        n = hidden.shape[0]
        page_table = meta.page_table
        segments = None if lora is None else lora.segments
        if segments is not None:
            require(self.has_lora and int(segments.starts[-1]) == n,
                     "lora rows need set_lora and segments over the step's {} rows", n)  # fmt: skip
        self._native.forward(
            hidden=hidden.data_ptr(),
            cos=cos.data_ptr(),
            signed_sin=signed_sin.data_ptr(),
            rope_stride=cos.stride(0),
            kv_caches=[cache.data_ptr() for cache in kv_caches],
            num_pages=kv_caches[0].shape[1],
            page_size=kv_caches[0].shape[3],
            slot_mapping=meta.slot_mapping.data_ptr(),
            page_table=page_table.data_ptr(),
            page_table_stride=page_table_stride(page_table),
            seq_lens=meta.seq_lens.data_ptr(),
            query_start_loc=meta.query_start_loc.data_ptr(),
            num_reqs=page_table.shape[0],
            num_tokens=n,
            max_query_len=meta.max_query_len,
            max_seq_len=meta.max_seq_len,
            num_threads=torch.get_num_threads(),
            amx_from_rows=self.amx_from_rows,
            amx_int8_from_rows=self.amx_int8_from_rows,
            amx_tile_order=self.amx_tile_order,
            quant_float_activations=self.quant_float_activations,
            quant_int16_activations=self.quant_int16_activations,
            kv_quant=int(kv_quant(kv_caches[0])),
            lora_starts=0 if segments is None else segments.starts.data_ptr(),
            lora_slots=0 if segments is None else segments.slots.data_ptr(),
            lora_num_segments=0 if segments is None else segments.num_segments,
            torch_lanes=torch_vector_lanes(),
        )
        return hidden

    def _check(
        self,
        hidden: torch.Tensor,
        cos: torch.Tensor,
        signed_sin: torch.Tensor,
        kv_caches: list[torch.Tensor],
        meta: AttentionMetadata,
    ) -> None:
        """Once per step, what the per-layer wrappers check once per call (the kernels check
        slots, page ids and lengths themselves)."""
        n, own = hidden.shape[0], self.dtype
        require(hidden.dtype == own and hidden.device.type == "cpu"
                 and hidden.shape == (n, self.hidden_size) and hidden.is_contiguous(),
                 "hidden must be a contiguous [{}, {}] {} CPU tensor, got {} {}", n,
                 self.hidden_size, own, hidden.dtype, tuple(hidden.shape))  # fmt: skip
        for name, table in (("cos", cos), ("signed_sin", signed_sin)):
            require(table.dtype == own and table.device.type == "cpu"
                     and table.shape[0] == n and table.numel() == n * self.head_size
                     and table.stride(-1) == 1 and table.stride(0) >= self.head_size,
                     "{} must be [{}, 1, {}] {} rows", name, n, self.head_size, own)  # fmt: skip
        require(len(kv_caches) == self._num_layers, "{} kv caches for {} layers",
                 len(kv_caches), self._num_layers)  # fmt: skip
        shape, dtype = kv_caches[0].shape, kv_caches[0].dtype
        row_size = kv_row_size(self.head_size, dtype)
        require(len(shape) == 5 and shape[0] == 2 and shape[2] == self.num_kv_heads
                 and shape[4] == row_size,
                 "kv_cache must be [2, num_pages, {}, page_size, {}], got {}", self.num_kv_heads,
                 row_size, tuple(shape))  # fmt: skip
        for cache in kv_caches:
            require(cache.shape == shape and cache.dtype == dtype
                     and dtype in (own, *KV_CPU_ONLY)
                     and cache.device.type == "cpu" and cache.is_contiguous(),
                     "every kv cache must be a contiguous {} {}, int8, fp8 or float16 CPU tensor",
                     tuple(shape), own)  # fmt: skip
        page_table, cpu = meta.page_table, hidden.device
        require(page_table.dim() == 2, "page_table must be 2-D, got {}", tuple(page_table.shape))
        num_reqs = page_table.shape[0]
        check_index("slot_mapping", meta.slot_mapping, torch.int64, (n,), cpu)
        check_index("page_table", page_table, torch.int32, page_table.shape, cpu)
        check_index("seq_lens", meta.seq_lens, torch.int32, (num_reqs,), cpu)
        check_index("query_start_loc", meta.query_start_loc, torch.int32, (num_reqs + 1,), cpu)
        require(0 <= meta.max_query_len <= meta.max_seq_len,
                 "need 0 <= max_query_len <= max_seq_len")  # fmt: skip
