# Type stubs of the compiled module pagedserve._core (cpp/bindings/), for mypy.
# Generated with `pybind11-stubgen pagedserve._core` from the built module, then formatted with
# ruff; regenerate after changing the bindings (scripts/gen_stubs.sh). tests/native/test_stubs.py
# checks that the stub and the built module name the same things.
"""
pagedserve native core: page allocator, scheduler, CPU kernels
"""

from __future__ import annotations

import collections.abc
import typing

import numpy
import numpy.typing

__all__: list[str] = [
    "AdmissionError",
    "AttentionArgs",
    "CacheWriteArgs",
    "DType",
    "DecoderLayerWeights",
    "DecoderStack",
    "KV_CACHE_DIMS",
    "KV_SCALE_BYTES",
    "KvCacheView",
    "KvEventLog",
    "KvQuant",
    "PageAllocator",
    "Scheduler",
    "SchedulerStats",
    "StepPlan",
    "TokenTensor",
    "cpu_features",
    "cpu_isa",
    "cpu_isa_supported",
    "gated_rows",
    "linear_amx_emulation",
    "linear_amx_items",
    "linear_amx_supported",
    "linear_bf16",
    "linear_bf16_supported",
    "linear_f32",
    "linear_items_taken_over",
    "linear_path",
    "pack_gated_weight_bf16",
    "pack_gated_weight_f32",
    "pack_linear_weight_bf16",
    "pack_linear_weight_f32",
    "pack_quant_weight",
    "packed_linear_elements",
    "packed_linear_elements_f32",
    "packed_quant_bytes",
    "paged_attention",
    "paged_attention_cpu_path",
    "quant_block_features",
    "quant_linear",
    "quant_linear_amx_supported",
    "quant_linear_float_path",
    "quant_linear_int16_path",
    "quant_linear_path",
    "quant_row_bytes",
    "quant_type_supported",
    "reshape_and_cache",
    "rms_norm",
    "rotary",
    "set_cpu_isa",
    "silu_and_mul",
]

class KvEventLog:
    def __len__(self) -> int: ...
    def drain(self, page_size: typing.SupportsInt | typing.SupportsIndex) -> tuple[typing.Any, ...]:
        """
        (kinds, hashes, parent_hashes, has_parent, salts, token_ids), oldest first; empties it
        """
    @property
    def enabled(self) -> bool: ...
    @enabled.setter
    def enabled(self, arg0: bool) -> None: ...

class LoraStacks:
    def __init__(
        self,
        *,
        a: typing.SupportsInt | typing.SupportsIndex,
        b: typing.SupportsInt | typing.SupportsIndex,
        ranks: typing.SupportsInt | typing.SupportsIndex,
        num_slots: typing.SupportsInt | typing.SupportsIndex,
        k: typing.SupportsInt | typing.SupportsIndex,
        max_rank: typing.SupportsInt | typing.SupportsIndex,
        part_widths: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex],
        float32: bool,
    ) -> None: ...
    @property
    def k(self) -> int: ...
    @property
    def max_rank(self) -> int: ...
    @property
    def n(self) -> int: ...
    @property
    def num_slots(self) -> int: ...

class PageAllocator:
    def __init__(
        self,
        num_pages: typing.SupportsInt | typing.SupportsIndex,
        page_size: typing.SupportsInt | typing.SupportsIndex,
        enable_prefix_caching: bool = True,
    ) -> None: ...
    def allocate(self, n: typing.SupportsInt | typing.SupportsIndex) -> list[int] | None:
        """
        n fresh pages, or None (all or nothing)
        """
    def generation(self, page: typing.SupportsInt | typing.SupportsIndex) -> int: ...
    def incref(self, page: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    def match_prefix(
        self,
        token_ids: typing.Annotated[numpy.typing.ArrayLike, numpy.int32],
        max_pages: typing.SupportsInt | typing.SupportsIndex,
        salt: typing.SupportsInt | typing.SupportsIndex = 0,
    ) -> list[int]: ...
    def ref_count(self, page: typing.SupportsInt | typing.SupportsIndex) -> int: ...
    def register_page(
        self,
        page: typing.SupportsInt | typing.SupportsIndex,
        parent: typing.SupportsInt | typing.SupportsIndex,
        parent_generation: typing.SupportsInt | typing.SupportsIndex,
        token_ids: typing.Annotated[numpy.typing.ArrayLike, numpy.int32],
        salt: typing.SupportsInt | typing.SupportsIndex = 0,
    ) -> int: ...
    def release(self, page: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def kv_events(self) -> KvEventLog: ...
    @property
    def num_cached_pages(self) -> int: ...
    @property
    def num_free_pages(self) -> int: ...
    @property
    def num_pages(self) -> int: ...
    @property
    def num_used_pages(self) -> int: ...
    @property
    def page_size(self) -> int: ...

class AdmissionError(ValueError):
    pass

class StepPlan:
    @property
    def input_ids(self) -> numpy.ndarray: ...
    @property
    def logits_indices(self) -> numpy.ndarray: ...
    @property
    def num_draft_tokens(self) -> numpy.ndarray: ...
    @property
    def max_pages(self) -> int: ...
    @property
    def max_query_len(self) -> int: ...
    @property
    def max_seq_len(self) -> int: ...
    @property
    def num_computed_tokens(self) -> numpy.ndarray: ...
    @property
    def num_reqs(self) -> int: ...
    @property
    def num_sampled(self) -> int: ...
    @property
    def num_scheduled_tokens(self) -> numpy.ndarray: ...
    @property
    def num_tokens(self) -> int: ...
    @property
    def page_table(self) -> numpy.ndarray: ...
    @property
    def positions(self) -> numpy.ndarray: ...
    @property
    def preempted_seq_ids(self) -> numpy.ndarray: ...
    @property
    def query_start_loc(self) -> numpy.ndarray: ...
    @property
    def sample_seq_ids(self) -> numpy.ndarray: ...
    @property
    def seq_ids(self) -> numpy.ndarray: ...
    @property
    def seq_lens(self) -> numpy.ndarray: ...
    @property
    def slot_mapping(self) -> numpy.ndarray: ...
    @property
    def step(self) -> int: ...

class SchedulerStats:
    @property
    def num_cached_pages(self) -> int: ...
    @property
    def num_free_pages(self) -> int: ...
    @property
    def num_pages(self) -> int: ...
    @property
    def num_preemptions(self) -> int: ...
    @property
    def num_used_pages(self) -> int: ...
    @property
    def page_size(self) -> int: ...
    @property
    def prefix_hit_tokens(self) -> int: ...
    @property
    def prefix_query_tokens(self) -> int: ...

class Scheduler:
    def __init__(
        self,
        *,
        num_pages: typing.SupportsInt | typing.SupportsIndex,
        page_size: typing.SupportsInt | typing.SupportsIndex,
        max_num_seqs: typing.SupportsInt | typing.SupportsIndex,
        max_num_batched_tokens: typing.SupportsInt | typing.SupportsIndex,
        max_model_len: typing.SupportsInt | typing.SupportsIndex,
        enable_prefix_caching: bool,
        max_prefill_tokens_while_decoding: typing.SupportsInt | typing.SupportsIndex = 0,
    ) -> None: ...
    def abort(self, seq_id: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    def add_request(
        self,
        seq_id: typing.SupportsInt | typing.SupportsIndex,
        prompt_token_ids: typing.Annotated[numpy.typing.ArrayLike, numpy.int32],
        max_tokens: typing.SupportsInt | typing.SupportsIndex,
        use_prefix_cache: bool = True,
        cache_salt: typing.SupportsInt | typing.SupportsIndex = 0,
        whole_spans: typing.Annotated[numpy.typing.ArrayLike, numpy.int32] | None = None,
    ) -> None: ...
    def cached_page_hashes(self) -> list[int]: ...
    def finish(self, seq_id: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    def num_cached_tokens(self, seq_id: typing.SupportsInt | typing.SupportsIndex) -> int: ...
    def num_computed_tokens(self, seq_id: typing.SupportsInt | typing.SupportsIndex) -> int: ...
    def page_ids(self, seq_id: typing.SupportsInt | typing.SupportsIndex) -> list[int]: ...
    def ref_count(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> int: ...
    def propose(
        self,
        seq_id: typing.SupportsInt | typing.SupportsIndex,
        draft_token_ids: typing.Annotated[numpy.typing.ArrayLike, numpy.int32],
    ) -> None:
        """
        Draft tokens of a decoding sequence for the next schedule() only
        """
    def schedule(self) -> StepPlan:
        """
        The next step's plan: a view of the scheduler's buffers, valid until the next schedule()
        """
    def stats(self) -> SchedulerStats: ...
    def update(
        self,
        step: typing.SupportsInt | typing.SupportsIndex,
        sampled_token_ids: typing.Annotated[numpy.typing.ArrayLike, numpy.int32],
        num_accepted: typing.Annotated[numpy.typing.ArrayLike, numpy.int32] | None = None,
    ) -> None: ...
    @property
    def has_unfinished(self) -> bool: ...
    @property
    def kv_events(self) -> KvEventLog: ...
    @property
    def num_running(self) -> int: ...
    @property
    def num_waiting(self) -> int: ...

class DType:
    """
    Members:

      float32

      bfloat16

      float16
    """

    __members__: typing.ClassVar[dict[str, DType]]
    bfloat16: typing.ClassVar[DType]
    float16: typing.ClassVar[DType]
    float32: typing.ClassVar[DType]
    @typing.overload
    def __eq__(self, other: DType) -> bool: ...
    @typing.overload
    def __eq__(self, other: typing.Any) -> bool: ...
    def __getstate__(self) -> int: ...
    def __hash__(self) -> int: ...
    def __index__(self) -> int: ...
    def __init__(self, value: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    def __int__(self) -> int: ...
    @typing.overload
    def __ne__(self, other: DType) -> bool: ...
    @typing.overload
    def __ne__(self, other: typing.Any) -> bool: ...
    def __repr__(self) -> str: ...
    def __setstate__(self, state: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    def __str__(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> int: ...

class KvCacheView:
    def __init__(self) -> None: ...
    @property
    def data(self) -> int: ...
    @data.setter
    def data(self, arg1: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def head_size(self) -> int: ...
    @head_size.setter
    def head_size(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def num_kv_heads(self) -> int: ...
    @num_kv_heads.setter
    def num_kv_heads(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def num_pages(self) -> int: ...
    @num_pages.setter
    def num_pages(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def page_size(self) -> int: ...
    @page_size.setter
    def page_size(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def quant(self) -> KvQuant: ...
    @quant.setter
    def quant(self, arg0: KvQuant) -> None: ...

class KvQuant:
    """
    Members:

      none

      int8

      fp16

      fp8_e4m3
    """

    __members__: typing.ClassVar[dict[str, KvQuant]]
    fp16: typing.ClassVar[KvQuant]
    fp8_e4m3: typing.ClassVar[KvQuant]
    int8: typing.ClassVar[KvQuant]
    none: typing.ClassVar[KvQuant]
    @typing.overload
    def __eq__(self, other: KvQuant) -> bool: ...
    @typing.overload
    def __eq__(self, other: typing.Any) -> bool: ...
    def __getstate__(self) -> int: ...
    def __hash__(self) -> int: ...
    def __index__(self) -> int: ...
    def __init__(self, value: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    def __int__(self) -> int: ...
    @typing.overload
    def __ne__(self, other: KvQuant) -> bool: ...
    @typing.overload
    def __ne__(self, other: typing.Any) -> bool: ...
    def __repr__(self) -> str: ...
    def __setstate__(self, state: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    def __str__(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> int: ...

class TokenTensor:
    def __init__(self) -> None: ...
    @property
    def data(self) -> int: ...
    @data.setter
    def data(self, arg1: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def head_stride(self) -> int: ...
    @head_stride.setter
    def head_stride(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def token_stride(self) -> int: ...
    @token_stride.setter
    def token_stride(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...

class CacheWriteArgs:
    cache: KvCacheView
    dtype: DType
    key: TokenTensor
    value: TokenTensor
    def __init__(self) -> None: ...
    @property
    def num_tokens(self) -> int: ...
    @num_tokens.setter
    def num_tokens(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def slot_mapping(self) -> int: ...
    @slot_mapping.setter
    def slot_mapping(self, arg1: typing.SupportsInt | typing.SupportsIndex) -> None: ...

class AttentionArgs:
    batch_invariant: bool
    cache: KvCacheView
    dtype: DType
    query: TokenTensor
    def __init__(self) -> None: ...
    @property
    def logit_softcap(self) -> float: ...
    @logit_softcap.setter
    def logit_softcap(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None: ...
    @property
    def max_query_len(self) -> int: ...
    @max_query_len.setter
    def max_query_len(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def max_seq_len(self) -> int: ...
    @max_seq_len.setter
    def max_seq_len(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def num_heads(self) -> int: ...
    @num_heads.setter
    def num_heads(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def num_reqs(self) -> int: ...
    @num_reqs.setter
    def num_reqs(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def num_tokens(self) -> int: ...
    @num_tokens.setter
    def num_tokens(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def out(self) -> int: ...
    @out.setter
    def out(self, arg1: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def out_head_stride(self) -> int: ...
    @out_head_stride.setter
    def out_head_stride(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def out_token_stride(self) -> int: ...
    @out_token_stride.setter
    def out_token_stride(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def page_table(self) -> int: ...
    @page_table.setter
    def page_table(self, arg1: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def page_table_stride(self) -> int: ...
    @page_table_stride.setter
    def page_table_stride(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def query_start_loc(self) -> int: ...
    @query_start_loc.setter
    def query_start_loc(self, arg1: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def scale(self) -> float: ...
    @scale.setter
    def scale(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None: ...
    @property
    def seq_lens(self) -> int: ...
    @seq_lens.setter
    def seq_lens(self, arg1: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def sliding_window(self) -> int: ...
    @sliding_window.setter
    def sliding_window(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...

class DecoderLayerLora:
    def __init__(
        self,
        *,
        qkv: LoraStacks | None = None,
        o: LoraStacks | None = None,
        gate_up: LoraStacks | None = None,
        down: LoraStacks | None = None,
    ) -> None: ...

class DecoderLayerWeights:
    def __init__(
        self,
        *,
        input_norm: typing.SupportsInt | typing.SupportsIndex,
        qkv: typing.SupportsInt | typing.SupportsIndex,
        qkv_bias: typing.SupportsInt | typing.SupportsIndex,
        o: typing.SupportsInt | typing.SupportsIndex,
        post_norm: typing.SupportsInt | typing.SupportsIndex,
        gate_up: typing.SupportsInt | typing.SupportsIndex,
        down: typing.SupportsInt | typing.SupportsIndex,
        sliding_window: typing.SupportsInt | typing.SupportsIndex = 0,
        logit_softcap: typing.SupportsFloat | typing.SupportsIndex = 0.0,
        qkv_type: typing.SupportsInt | typing.SupportsIndex = 0,
        o_type: typing.SupportsInt | typing.SupportsIndex = 0,
        gate_up_type: typing.SupportsInt | typing.SupportsIndex = 0,
        down_type: typing.SupportsInt | typing.SupportsIndex = 0,
    ) -> None: ...
    @property
    def down(self) -> int: ...
    @down.setter
    def down(self, arg1: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def down_type(self) -> int: ...
    @property
    def gate_up(self) -> int: ...
    @gate_up.setter
    def gate_up(self, arg1: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def gate_up_type(self) -> int: ...
    @property
    def input_norm(self) -> int: ...
    @input_norm.setter
    def input_norm(self, arg1: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def logit_softcap(self) -> float: ...
    @property
    def o(self) -> int: ...
    @o.setter
    def o(self, arg1: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def o_type(self) -> int: ...
    @property
    def post_norm(self) -> int: ...
    @post_norm.setter
    def post_norm(self, arg1: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def qkv(self) -> int: ...
    @qkv.setter
    def qkv(self, arg1: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def qkv_bias(self) -> int: ...
    @qkv_bias.setter
    def qkv_bias(self, arg1: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def qkv_type(self) -> int: ...
    @property
    def sliding_window(self) -> int: ...

class DecoderStack:
    def __init__(
        self,
        hidden_size: typing.SupportsInt | typing.SupportsIndex,
        num_heads: typing.SupportsInt | typing.SupportsIndex,
        num_kv_heads: typing.SupportsInt | typing.SupportsIndex,
        head_size: typing.SupportsInt | typing.SupportsIndex,
        intermediate_size: typing.SupportsInt | typing.SupportsIndex,
        rms_norm_eps: typing.SupportsFloat | typing.SupportsIndex,
        scale: typing.SupportsFloat | typing.SupportsIndex,
        layers: collections.abc.Sequence[DecoderLayerWeights],
        batch_invariant: bool = True,
    ) -> None: ...
    def forward(
        self,
        hidden: typing.SupportsInt | typing.SupportsIndex,
        cos: typing.SupportsInt | typing.SupportsIndex,
        signed_sin: typing.SupportsInt | typing.SupportsIndex,
        rope_stride: typing.SupportsInt | typing.SupportsIndex,
        kv_caches: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex],
        num_pages: typing.SupportsInt | typing.SupportsIndex,
        page_size: typing.SupportsInt | typing.SupportsIndex,
        slot_mapping: typing.SupportsInt | typing.SupportsIndex,
        page_table: typing.SupportsInt | typing.SupportsIndex,
        page_table_stride: typing.SupportsInt | typing.SupportsIndex,
        seq_lens: typing.SupportsInt | typing.SupportsIndex,
        query_start_loc: typing.SupportsInt | typing.SupportsIndex,
        num_reqs: typing.SupportsInt | typing.SupportsIndex,
        num_tokens: typing.SupportsInt | typing.SupportsIndex,
        max_query_len: typing.SupportsInt | typing.SupportsIndex,
        max_seq_len: typing.SupportsInt | typing.SupportsIndex,
        num_threads: typing.SupportsInt | typing.SupportsIndex,
        amx_from_rows: typing.SupportsInt | typing.SupportsIndex = 0,
        amx_int8_from_rows: typing.SupportsInt | typing.SupportsIndex = 0,
        amx_tile_order: bool = False,
        quant_float_activations: bool = False,
        kv_quant: typing.SupportsInt | typing.SupportsIndex = 0,
        quant_int16_activations: bool = False,
        lora_starts: typing.SupportsInt | typing.SupportsIndex = 0,
        lora_slots: typing.SupportsInt | typing.SupportsIndex = 0,
        lora_num_segments: typing.SupportsInt | typing.SupportsIndex = 0,
        torch_lanes: typing.SupportsInt | typing.SupportsIndex = 8,
    ) -> None: ...
    def set_lora(self, lora: collections.abc.Sequence[DecoderLayerLora]) -> None: ...
    @property
    def has_lora(self) -> bool: ...
    @property
    def num_layers(self) -> int: ...

def cpu_features() -> dict[str, bool]:
    """
    The CPU's AVX2 / AVX-512 / AMX flags (CPUID) and whether Linux granted AMX tile data; on aarch64 its NEON / dot-product / i8mm flags (Linux hwcaps).
    """

def cpu_isa() -> str:
    """
    The ISA level the kernels run at now.
    """

def cpu_isa_supported() -> str:
    """
    The best ISA level this CPU runs: portable, avx2, avx2_vnni, avx512, avx512_bf16 or amx (x86-64); neon, neon_dotprod or neon_i8mm (aarch64).
    """

def gated_rows(width: typing.SupportsInt | typing.SupportsIndex) -> int: ...
def linear_amx_emulation(on: bool) -> None: ...
def linear_amx_items() -> int: ...
def linear_amx_supported() -> bool: ...
def linear_bf16(
    x: typing.SupportsInt | typing.SupportsIndex,
    x_stride: typing.SupportsInt | typing.SupportsIndex,
    packed: typing.SupportsInt | typing.SupportsIndex,
    bias: typing.SupportsInt | typing.SupportsIndex,
    residual: typing.SupportsInt | typing.SupportsIndex,
    residual_stride: typing.SupportsInt | typing.SupportsIndex,
    out: typing.SupportsInt | typing.SupportsIndex,
    out_stride: typing.SupportsInt | typing.SupportsIndex,
    out_float32: bool,
    m: typing.SupportsInt | typing.SupportsIndex,
    n: typing.SupportsInt | typing.SupportsIndex,
    k: typing.SupportsInt | typing.SupportsIndex,
    gated_width: typing.SupportsInt | typing.SupportsIndex,
    num_threads: typing.SupportsInt | typing.SupportsIndex,
    amx_from_rows: typing.SupportsInt | typing.SupportsIndex = 0,
    tile_order: bool = False,
) -> None: ...
def linear_bf16_supported() -> bool: ...
def linear_f32(
    x: typing.SupportsInt | typing.SupportsIndex,
    x_stride: typing.SupportsInt | typing.SupportsIndex,
    packed: typing.SupportsInt | typing.SupportsIndex,
    bias: typing.SupportsInt | typing.SupportsIndex,
    residual: typing.SupportsInt | typing.SupportsIndex,
    residual_stride: typing.SupportsInt | typing.SupportsIndex,
    out: typing.SupportsInt | typing.SupportsIndex,
    out_stride: typing.SupportsInt | typing.SupportsIndex,
    m: typing.SupportsInt | typing.SupportsIndex,
    n: typing.SupportsInt | typing.SupportsIndex,
    k: typing.SupportsInt | typing.SupportsIndex,
    gated_width: typing.SupportsInt | typing.SupportsIndex,
    num_threads: typing.SupportsInt | typing.SupportsIndex,
) -> None: ...
def linear_items_taken_over() -> int: ...
def linear_path() -> str: ...
def pack_gated_weight_bf16(
    weight: typing.SupportsInt | typing.SupportsIndex,
    width: typing.SupportsInt | typing.SupportsIndex,
    k: typing.SupportsInt | typing.SupportsIndex,
    packed: typing.SupportsInt | typing.SupportsIndex,
    num_threads: typing.SupportsInt | typing.SupportsIndex,
) -> None: ...
def pack_gated_weight_f32(
    weight: typing.SupportsInt | typing.SupportsIndex,
    width: typing.SupportsInt | typing.SupportsIndex,
    k: typing.SupportsInt | typing.SupportsIndex,
    packed: typing.SupportsInt | typing.SupportsIndex,
    num_threads: typing.SupportsInt | typing.SupportsIndex,
) -> None: ...
def pack_linear_weight_bf16(
    weight: typing.SupportsInt | typing.SupportsIndex,
    n: typing.SupportsInt | typing.SupportsIndex,
    k: typing.SupportsInt | typing.SupportsIndex,
    packed: typing.SupportsInt | typing.SupportsIndex,
    num_threads: typing.SupportsInt | typing.SupportsIndex,
) -> None: ...
def pack_linear_weight_f32(
    weight: typing.SupportsInt | typing.SupportsIndex,
    n: typing.SupportsInt | typing.SupportsIndex,
    k: typing.SupportsInt | typing.SupportsIndex,
    packed: typing.SupportsInt | typing.SupportsIndex,
    num_threads: typing.SupportsInt | typing.SupportsIndex,
) -> None: ...
def pack_quant_weight(
    ggml_type: typing.SupportsInt | typing.SupportsIndex,
    rows: typing.SupportsInt | typing.SupportsIndex,
    n: typing.SupportsInt | typing.SupportsIndex,
    k: typing.SupportsInt | typing.SupportsIndex,
    packed: typing.SupportsInt | typing.SupportsIndex,
    num_threads: typing.SupportsInt | typing.SupportsIndex,
) -> None: ...
def packed_linear_elements(
    n: typing.SupportsInt | typing.SupportsIndex, k: typing.SupportsInt | typing.SupportsIndex
) -> int: ...
def packed_linear_elements_f32(
    n: typing.SupportsInt | typing.SupportsIndex, k: typing.SupportsInt | typing.SupportsIndex
) -> int: ...
def packed_quant_bytes(
    ggml_type: typing.SupportsInt | typing.SupportsIndex,
    n: typing.SupportsInt | typing.SupportsIndex,
    k: typing.SupportsInt | typing.SupportsIndex,
) -> int: ...
def lora_add(
    *,
    x: typing.SupportsInt | typing.SupportsIndex,
    x_stride: typing.SupportsInt | typing.SupportsIndex,
    x_float32: bool,
    y: typing.SupportsInt | typing.SupportsIndex,
    y_stride: typing.SupportsInt | typing.SupportsIndex,
    y_float32: bool,
    stacks: LoraStacks,
    starts: typing.SupportsInt | typing.SupportsIndex,
    slots: typing.SupportsInt | typing.SupportsIndex,
    num_segments: typing.SupportsInt | typing.SupportsIndex,
    num_threads: typing.SupportsInt | typing.SupportsIndex,
) -> None: ...
def lora_path() -> str: ...
def paged_attention(
    args: AttentionArgs, num_threads: typing.SupportsInt | typing.SupportsIndex
) -> None: ...
def paged_attention_cpu_path() -> str:
    """
    The CPU attention kernels of the active ISA level: portable, avx2, avx512 or avx512_bf16.
    """

def quant_block_features(ggml_type: typing.SupportsInt | typing.SupportsIndex) -> int: ...
def quant_linear(
    ggml_type: typing.SupportsInt | typing.SupportsIndex,
    x: typing.SupportsInt | typing.SupportsIndex,
    x_stride: typing.SupportsInt | typing.SupportsIndex,
    float32: bool,
    packed: typing.SupportsInt | typing.SupportsIndex,
    bias: typing.SupportsInt | typing.SupportsIndex,
    residual: typing.SupportsInt | typing.SupportsIndex,
    residual_stride: typing.SupportsInt | typing.SupportsIndex,
    out: typing.SupportsInt | typing.SupportsIndex,
    out_stride: typing.SupportsInt | typing.SupportsIndex,
    out_float32: bool,
    m: typing.SupportsInt | typing.SupportsIndex,
    n: typing.SupportsInt | typing.SupportsIndex,
    k: typing.SupportsInt | typing.SupportsIndex,
    gated_width: typing.SupportsInt | typing.SupportsIndex,
    num_threads: typing.SupportsInt | typing.SupportsIndex,
    force_portable: bool = False,
    dequant_bf16: bool = False,
    amx_from_rows: typing.SupportsInt | typing.SupportsIndex = 0,
    float_activations: bool = False,
    int16_activations: bool = False,
) -> None: ...
def quant_linear_amx_supported() -> bool: ...
def quant_linear_float_path() -> str: ...
def quant_linear_int16_path() -> str: ...
def quant_linear_path() -> str: ...
def quant_row_bytes(
    ggml_type: typing.SupportsInt | typing.SupportsIndex,
    k: typing.SupportsInt | typing.SupportsIndex,
) -> int: ...
def quant_type_supported(ggml_type: typing.SupportsInt | typing.SupportsIndex) -> bool: ...
def reshape_and_cache(
    args: CacheWriteArgs, num_threads: typing.SupportsInt | typing.SupportsIndex
) -> None: ...
def rms_norm(
    *,
    out: typing.SupportsInt | typing.SupportsIndex,
    out_stride: typing.SupportsInt | typing.SupportsIndex,
    x: typing.SupportsInt | typing.SupportsIndex,
    x_stride: typing.SupportsInt | typing.SupportsIndex,
    weight: typing.SupportsInt | typing.SupportsIndex,
    num_rows: typing.SupportsInt | typing.SupportsIndex,
    hidden_size: typing.SupportsInt | typing.SupportsIndex,
    eps: typing.SupportsFloat | typing.SupportsIndex,
    dtype: DType,
    sum_lanes: typing.SupportsInt | typing.SupportsIndex,
    num_threads: typing.SupportsInt | typing.SupportsIndex,
) -> None: ...
def rotary(
    *,
    qk: typing.SupportsInt | typing.SupportsIndex,
    token_stride: typing.SupportsInt | typing.SupportsIndex,
    head_stride: typing.SupportsInt | typing.SupportsIndex,
    cos: typing.SupportsInt | typing.SupportsIndex,
    cos_stride: typing.SupportsInt | typing.SupportsIndex,
    signed_sin: typing.SupportsInt | typing.SupportsIndex,
    signed_sin_stride: typing.SupportsInt | typing.SupportsIndex,
    num_tokens: typing.SupportsInt | typing.SupportsIndex,
    num_heads: typing.SupportsInt | typing.SupportsIndex,
    head_size: typing.SupportsInt | typing.SupportsIndex,
    dtype: DType,
    num_threads: typing.SupportsInt | typing.SupportsIndex,
) -> None: ...
def set_cpu_isa(level: str) -> str:
    """
    Lowers (or restores) the kernels' ISA level, capped at cpu_isa_supported(); returns the level now active.
    """

def silu_and_mul(
    *,
    out: typing.SupportsInt | typing.SupportsIndex,
    out_stride: typing.SupportsInt | typing.SupportsIndex,
    gate_up: typing.SupportsInt | typing.SupportsIndex,
    gate_up_stride: typing.SupportsInt | typing.SupportsIndex,
    num_rows: typing.SupportsInt | typing.SupportsIndex,
    intermediate_size: typing.SupportsInt | typing.SupportsIndex,
    dtype: DType,
    torch_lanes: typing.SupportsInt | typing.SupportsIndex,
    num_threads: typing.SupportsInt | typing.SupportsIndex,
) -> None: ...

KV_CACHE_DIMS: tuple[str, ...] = ("kv", "num_pages", "num_kv_heads", "page_size", "row_size")
KV_SCALE_BYTES: int = 4
