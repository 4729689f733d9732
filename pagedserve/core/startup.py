"""Start-up: resolve and load the model and tokenizer, pick device and dtype, size the KV cache.

Everything slow or device-dependent that happens once, before the first step, lives here so
that engine.py stays about steps.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from pagedserve.core.attention.base import AttentionBackend
from pagedserve.core.attention.registry import get_attention_backend
from pagedserve.core.chat_template import ChatTemplate, load_chat_template
from pagedserve.core.config import EngineConfig, ModelConfig
from pagedserve.core.distributed.launcher import TensorParallel
from pagedserve.core.distributed.worker import WorkerSpec, share_num_pages
from pagedserve.core.engine_client import ModelInfo
from pagedserve.core.kv_cache import KVCacheLayout, choose_num_pages
from pagedserve.core.model_runner import ModelRunner
from pagedserve.core.models import load_model
from pagedserve.core.models.arch import ArchConfig
from pagedserve.core.models.linear import PackableLinear
from pagedserve.core.models.linear_dispatch import (
    DispatchInputs,
    calibration_rows,
    plan_dispatch,
    quantized_amx_choice,
    tiles_agree_with_avx512,
)
from pagedserve.core.models.llama import LlamaForCausalLM
from pagedserve.core.models.loader_gguf import open_gguf
from pagedserve.core.models.pooling_config import resolve_pooler
from pagedserve.core.models.quantized import QuantizedGateUpLinear, QuantizedLinear, plan_quantized
from pagedserve.core.models.registry import read_arch
from pagedserve.core.models.resolve import ResolvedModel, resolve_model
from pagedserve.core.models.tensor_parallel import check_divisible
from pagedserve.core.ops.attention import cpu_attention_path
from pagedserve.core.ops.cpu_features import cpu_isa, cpu_isa_supported, isa_at_least, set_cpu_isa
from pagedserve.core.ops.linear import amx_available, native_linear_available
from pagedserve.core.ops.linear_quant import quant_linear_path
from pagedserve.core.pooling_params import PoolerConfig
from pagedserve.core.scheduler import Scheduler
from pagedserve.core.spec_decode.draft import DraftModel
from pagedserve.core.tokenizer import Tokenizer, load_tokenizer

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class EngineParts:
    resolved: ResolvedModel
    tokenizer: Tokenizer
    chat_template: ChatTemplate | None
    arch: ArchConfig
    model_runner: ModelRunner
    scheduler: Scheduler
    max_model_len: int
    kv_layout: KVCacheLayout
    batch_invariant: bool
    """Greedy and seeded results are a function of the request alone (see is_batch_invariant)."""
    weights: str = ""
    """What runs the weights (ModelInfo.weights)."""
    pooler: PoolerConfig | None = None
    """How embedding requests pool (task embed); None: the model generates."""
    can_generate: bool = True
    """The model has an LM head (an embedding checkpoint may have none)."""

    @property
    def model_info(self) -> ModelInfo:
        return ModelInfo(
            name=self.resolved.name,
            max_model_len=self.max_model_len,
            vocab_size=self.tokenizer.vocab_size,
            page_size=self.kv_layout.spec.page_size,
            num_pages=self.kv_layout.num_pages,
            dtype=str(self.model_runner.dtype).removeprefix("torch."),
            device=str(self.model_runner.device),
            batch_invariant=self.batch_invariant,
            weights=self.weights,
            task="embed" if self.pooler is not None else "generate",
            pooler=self.pooler,
        )


def choose_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: cuda was asked for but torch sees no CUDA device")
    return torch.device(name)


def cpu_has_bf16() -> bool:
    """ISA level avx512_bf16 or above (AVX-512 BF16, or AMX): bf16 matmuls run at about twice
    fp32's speed there."""
    return isa_at_least("avx512_bf16")


def cpu_kernels(deterministic: bool, quantized: bool, dtype: torch.dtype) -> str:
    """The start-up line's CPU kernels, e.g. "cpu kernels: isa avx2 (attention avx2, int8
    linear avx2)" (the int8 path only for weights kept quantized), and what --deterministic
    means at that level."""
    attention = cpu_attention_path()
    int8 = f", int8 linear {quant_linear_path()}" if quantized else ""
    text = f"cpu kernels: isa {cpu_isa()} (attention {attention}{int8})"
    if deterministic:  # attention/kernels.hpp: every level rounds alike, but for vdpbf16ps
        text += "; deterministic: attention scores alike in any batch"
        if dtype == torch.float32 or attention != "avx512_bf16":
            text += ", its bits the same at every level"
    elif attention in ("portable", "avx2"):
        text += "; --no-deterministic: no faster decode attention at this level"
    return text


def apply_cpu_isa(name: str) -> str:
    """Sets the native kernels' ISA level (auto: the CPU's best); returns the level that runs."""
    if name == "auto":
        return set_cpu_isa(cpu_isa_supported())
    level = set_cpu_isa(name)
    if level != name and name == "avx2_vnni":
        logger.warning("cpu_isa avx2_vnni: this CPU has no AVX-VNNI, so the kernels run at avx2")
    elif level != name:
        logger.warning("cpu_isa %s: this CPU runs up to %s, so the kernels run at %s", name,
                       cpu_isa_supported(), level)  # fmt: skip
    return level


def choose_dtype(name: str, device: torch.device, quantized: bool = False) -> torch.dtype:
    """--dtype auto: bf16 on CUDA where the GPU has it (else fp16); on a CPU, bf16 where it has
    AVX512-BF16, or, from ISA level avx2, where the linears run on native kernels that take bf16
    and compute in fp32: the quantized ones (`quantized`: every linear kept quantized) or the
    dense ones (AVX2 FMAs on bf16 widened in registers). bf16 is then storage between the layers
    and lets the native decoder stack run (measured on dense SmolLM2-135M at level avx2: faster
    than fp32, on torch's matmul or the native fp32 kernel, at c=1 decode and in a 1,000-token
    prefill); else float32."""
    if name != "auto":
        return DTYPES[name]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    # Measured in bench/RESULTS.md: bf16 is faster on CPUs with native bf16 dot products.
    if cpu_has_bf16() or (isa_at_least("avx2") and (quantized or native_linear_available())):
        return torch.bfloat16
    return torch.float32


def every_linear_quantized(resolved: ResolvedModel, mc: ModelConfig, tensor_parallel: bool) -> bool:
    """The CPU model will run every linear on the quantized kernels (quantization auto, a GGUF
    whose every linear has a kernel, no tensor parallelism: shards are dequantized)."""
    if mc.quantization != "auto" or resolved.format != "gguf" or tensor_parallel:
        return False
    arch, reader = open_gguf(resolved.path)
    plan = plan_quantized(reader, arch, dtype=torch.float32, device=torch.device("cpu"), quiet=True)
    return plan.every_linear_kept


def build_engine_parts(config: EngineConfig) -> EngineParts:
    mc, cc, sc = config.model, config.cache, config.scheduler
    apply_cpu_isa(mc.cpu_isa)
    resolved = resolve_model(mc.model)
    device = choose_device(mc.device)
    quantized = (
        mc.dtype == "auto"
        and device.type == "cpu"
        and not cpu_has_bf16()
        and every_linear_quantized(resolved, mc, config.parallel.tensor_parallel_size > 1)
    )
    dtype = choose_dtype(mc.dtype, device, quantized)
    tokenizer = load_tokenizer(resolved.path)
    template_path = Path(mc.chat_template) if mc.chat_template else None
    chat_template = load_chat_template(tokenizer, template_path)
    attention = get_attention_backend(mc.attention_backend, mc.deterministic)
    pooler = resolve_pooler(mc.task, resolved, read_arch(resolved).hidden_size, mc.matryoshka)
    if pooler is not None and config.parallel.tensor_parallel_size > 1:
        raise ValueError("task embed runs at tensor_parallel_size 1")
    tp = start_tensor_parallel(config, resolved, dtype, device)
    device = tp.group.device if tp is not None else device  # a GPU per rank: this rank's
    try:
        # max_positions: the rope tables' length, and longrope's short/long choice (llama.cpp's:
        # long factors only when the served context exceeds the original one).
        model, arch = load_model(
            resolved,
            dtype=dtype,
            device=device,
            attention=attention,
            max_positions=mc.max_model_len,
            group=tp.group if tp else None,
            quantization=mc.quantization,
            pack=False,
            head_optional=pooler is not None,
        )
        linears = pack_for_dispatch(model, config, dtype, device, tensor_parallel=tp is not None)
        weights = model.quantization or str(dtype).removeprefix("torch.")
        weights += f"; {linears}" if linears else ""
        if device.type == "cpu":
            weights += f"; {cpu_kernels(mc.deterministic, bool(model.quantization), dtype)}"
        max_model_len = _max_model_len(mc, arch)
        spec = ModelRunner.kv_spec(model.arch, cc.page_size, dtype)  # this rank's KV heads
        pages_per_request = -(-max_model_len // cc.page_size)
        num_pages = cc.num_pages or choose_num_pages(
            spec, _kv_budget_bytes(config, device), pages_per_request
        )
        if tp is not None:
            share_num_pages(tp.group, num_pages)  # the same pages (page tables) on every rank
    except BaseException:
        if tp is not None:
            tp.close(polite=False)
        raise
    layout = KVCacheLayout(spec, num_pages)
    draft = None
    if config.speculative.speculative_method == "draft":
        if tp is not None:
            raise ValueError("speculative_method draft runs at tensor_parallel_size 1")
        draft = build_draft_model(config, tokenizer, dtype, device, num_pages)
    runner = ModelRunner(
        model,
        model.arch,
        num_pages=num_pages,
        page_size=cc.page_size,
        dtype=dtype,
        device=device,
        vocab_size=tokenizer.vocab_size,
        eos_token_ids=tokenizer.eos_token_ids,
        tp=tp,
        pooler=pooler,
        draft=draft,
    )
    scheduler = Scheduler(
        num_pages=num_pages,
        page_size=cc.page_size,
        max_num_seqs=sc.max_num_seqs,
        max_num_batched_tokens=sc.max_num_batched_tokens,
        max_prefill_tokens_while_decoding=sc.max_prefill_tokens_while_decoding,
        # An embedding request's prompt may fill the context: the placeholder token it
        # "samples" (never computed, never in the KV cache) is the one beyond.
        max_model_len=max_model_len + (pooler is not None),
        enable_prefix_caching=cc.enable_prefix_caching,
    )
    # Not claimed across ranks: an all-reduce's summation order may follow the tensor's size
    # (gloo's and NCCL's algorithms chunk by size), so by the batch.
    invariant = tp is None and is_batch_invariant(model, attention, device)
    logger.info(
        "model %s (%s, task %s) on %s in %s, weights: %s, tensor_parallel_size %d, "
        "attention %s, %sbatch-invariant; %s",
        resolved.name,
        arch.architecture,
        _describe_task(pooler),
        device,
        dtype,
        weights,
        config.parallel.tensor_parallel_size,
        attention.name,
        "" if invariant else "not ",
        layout.describe(),
    )
    return EngineParts(
        resolved,
        tokenizer,
        chat_template,
        arch,
        runner,
        scheduler,
        max_model_len,
        layout,
        invariant,
        weights,
        pooler,
        model.has_lm_head,
    )


def _describe_task(pooler: PoolerConfig | None) -> str:
    if pooler is None:
        return "generate"
    normalized = ", normalized" if pooler.normalize else ""
    return f"embed: {pooler.pooling} pooling{normalized}, {pooler.dimensions} dimensions"


def pack_for_dispatch(
    model: LlamaForCausalLM,
    config: EngineConfig,
    dtype: torch.dtype,
    device: torch.device,
    *,
    tensor_parallel: bool,
) -> str:
    """Pack the weights for the CPU linear path ModelConfig.cpu_linear picks (a calibration
    for auto: models/linear_dispatch.py) and route the steps; what runs, "" off the CPU."""
    if device.type != "cpu":
        model.pack_weights()
        return ""
    mc, start = config.model, time.perf_counter()
    inputs = DispatchInputs(
        arch=model.arch,
        dtype=dtype,
        max_num_batched_tokens=config.scheduler.max_num_batched_tokens,
        quantized=bool(model.quantization),
        tensor_parallel=tensor_parallel,
        dense=bool(model.dense_projections()),
    )
    dispatch = plan_dispatch(mc.cpu_linear, mc.deterministic, inputs)
    model.pack_weights(keep_unpacked=dispatch.keeps_weights)
    kept = model.route_linears(dispatch.torch_from)
    layers = model.decoder_layers()
    int8_from, int8_note = quantized_amx_choice(
        list(layers[0].modules()) if layers and model.quantization else [],
        calibration_rows(config.scheduler.max_num_batched_tokens),
        dtype,
    )
    model.use_amx(dispatch.amx_from, int8_from, dispatch.amx_tile_order)
    if int8_note:
        dispatch = replace(dispatch, summary=f"{dispatch.summary}; quantized kernel: {int8_note}")
    logger.info(
        "%s (decided in %.2f s)%s",
        dispatch.summary,
        time.perf_counter() - start,
        f"; the unpacked weights kept for torch take {kept / 2**20:.1f} MiB more" if kept else "",
    )
    return dispatch.summary


def start_tensor_parallel(
    config: EngineConfig, resolved: ResolvedModel, dtype: torch.dtype, device: torch.device
) -> TensorParallel | None:
    """At tensor_parallel_size > 1, check the model divides, then start this node's workers and
    join every rank (rank 0 is this process); None at 1."""
    parallel = config.parallel
    if parallel.tensor_parallel_size == 1:
        return None
    if parallel.node_rank != 0:
        raise ValueError("node_rank: only node 0 runs the engine (other nodes run workers)")
    check_divisible(read_arch(resolved), parallel.tensor_parallel_size)
    spec = WorkerSpec(
        resolved=resolved,
        dtype=dtype,
        device=device,
        attention_backend=config.model.attention_backend,
        deterministic=config.model.deterministic,
        max_positions=config.model.max_model_len,
        page_size=config.cache.page_size,
        parallel=parallel,
    )
    return TensorParallel.start(spec)


def build_draft_model(
    config: EngineConfig,
    tokenizer: Tokenizer,
    dtype: torch.dtype,
    device: torch.device,
    num_pages: int,
) -> DraftModel:
    """--speculative-model, loaded as the target is (dtype, device, kernels), with a KV pool of
    the target's number of pages; ValueError when its vocabulary is not the target's."""
    mc, path = config.model, config.speculative.speculative_model
    assert path, "SpeculativeConfig checks that draft has a model"
    resolved = resolve_model(path)
    draft_vocab = load_tokenizer(resolved.path).vocab_size
    if draft_vocab != tokenizer.vocab_size:
        raise ValueError(
            f"speculative_model: {resolved.name} has {draft_vocab} tokens, the target "
            f"{tokenizer.vocab_size}: a draft model needs the target's tokenizer"
        )
    attention = get_attention_backend(mc.attention_backend, mc.deterministic)
    model, _arch = load_model(resolved, dtype=dtype, device=device, attention=attention,
                              max_positions=mc.max_model_len, group=None,
                              quantization=mc.quantization, pack=False)  # fmt: skip
    pack_for_dispatch(model, config, dtype, device, tensor_parallel=False)
    page_size = config.cache.page_size
    return DraftModel(model, num_pages=num_pages, page_size=page_size, dtype=dtype, device=device)


def is_batch_invariant(
    model: torch.nn.Module, attention: AttentionBackend, device: torch.device
) -> bool:
    """True when every kernel of a forward fixes each output's reduction order whatever the
    batch, the prefill chunking, the cache hits and the thread count (issue 16): every linear
    layer on the native bf16/fp32 kernel at every row count (no step routed to torch by
    --cpu-linear) or on the quantized one and the native CPU attention
    with batch_invariant on (--deterministic, the default). torch's matmul (float16, CUDA, CPUs
    without AVX512-BF16), the torch reference attention, --no-deterministic and the CUDA
    kernels (whose decode splits long contexts) are not. The native kernel's AMX tiles keep it
    at every row count or none, or from a row count where the rows below round as they do
    (AVX512-BF16 itself, or summing in the tiles' order)."""
    linears = [m for m in model.modules() if isinstance(m, PackableLinear)]
    orders = {m.tile_order for m in linears if m.amx_from > 1}  # thresholds, by their order
    quantized = any(isinstance(m, QuantizedLinear | QuantizedGateUpLinear) for m in model.modules())
    return (
        device.type == "cpu"
        and attention.batch_invariant
        and (bool(linears) or quantized)
        and all(m.packed is not None and m.torch_from is None for m in linears)
        and (not amx_available() or all(tiles_agree_with_avx512(order) for order in orders))
    )


def _max_model_len(mc: ModelConfig, arch: ArchConfig) -> int:
    if mc.max_model_len is None:
        return arch.max_position_embeddings
    if mc.max_model_len > arch.max_position_embeddings:
        raise ValueError(
            f"max_model_len: {mc.max_model_len} exceeds the model's "
            f"{arch.max_position_embeddings} positions"
        )
    return mc.max_model_len


def _kv_budget_bytes(config: EngineConfig, device: torch.device) -> int:
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free * config.cache.gpu_memory_utilization)
    return int(config.cache.kv_cache_memory * (1 << 30))
