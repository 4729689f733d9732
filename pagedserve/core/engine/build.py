"""Wiring: an EngineConfig becomes the engine's parts, once, before the first step.

Every decision is one call to the module that owns it, so that this file only connects them:
device_policy (ISA level, device, dtype, linear dispatch, batch invariance), models.load_model
(the weights), executor.launcher (tensor-parallel ranks), spec_decode.draft (the draft model),
sched.kv_cache (how many KV pages), tokenizers (tokenizer and chat template); combinations
refuses, before any weights load, the features that do not run together.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from pagedserve.core.attention.base import kv_cache_dtype
from pagedserve.core.attention.registry import get_attention_backend
from pagedserve.core.config import EngineConfig
from pagedserve.core.device_policy import (
    apply_cpu_isa,
    choose_device,
    choose_model_dtype,
    is_batch_invariant,
    kv_budget_bytes,
    load_for_engine,
    resolve_kv_cache_dtype,
    resolve_quantized_activations,
)
from pagedserve.core.engine.combinations import refuse_unsupported
from pagedserve.core.engine.parts import EngineParts
from pagedserve.core.executor.launcher import TensorParallel, start_tensor_parallel
from pagedserve.core.executor.worker import share_num_pages
from pagedserve.core.lora.gguf import LoraBase
from pagedserve.core.lora.registry import LoraRegistry
from pagedserve.core.models.arch import ArchConfig
from pagedserve.core.models.base import CausalLM
from pagedserve.core.models.pooling_config import resolve_pooler
from pagedserve.core.models.registry import image_processor_for, read_arch
from pagedserve.core.models.resolve import ResolvedModel, resolve_model
from pagedserve.core.pooling_params import PoolerConfig
from pagedserve.core.runner.memory import give_back_loading_memory
from pagedserve.core.runner.model_runner import ModelRunner
from pagedserve.core.sched.kv_cache import KVCacheLayout, resolve_max_model_len, size_kv_cache
from pagedserve.core.sched.scheduler import Scheduler
from pagedserve.core.spec_decode.draft import build_draft_model
from pagedserve.core.tokenizers.chat_template import load_chat_template
from pagedserve.core.tokenizers.load import Tokenizer, load_tokenizer

logger = logging.getLogger(__name__)


@dataclass
class _Loaded:  # the model on its device, with what start-up decided around it
    model: CausalLM
    arch: ArchConfig
    """The whole model's shape (model.arch is this rank's under tensor parallelism)."""
    weights: str
    max_model_len: int
    layout: KVCacheLayout
    kv_dtype: torch.dtype


def build_engine_parts(config: EngineConfig) -> EngineParts:
    mc = config.model
    apply_cpu_isa(mc.cpu_isa)
    resolved = resolve_model(mc.model, mmproj=mc.mmproj)
    device = choose_device(mc.device)
    config = resolve_quantized_activations(config, resolved, device)
    config = resolve_kv_cache_dtype(config, resolved, device)
    mc = config.model
    dtype = choose_model_dtype(config, resolved, device)
    tokenizer = load_tokenizer(resolved.path)
    template_path = Path(mc.chat_template) if mc.chat_template else None
    chat_template = load_chat_template(tokenizer, template_path)
    attention = get_attention_backend(mc.attention_backend, mc.deterministic)
    shape = read_arch(resolved)
    pooler = resolve_pooler(mc.task, resolved, shape.hidden_size, mc.matryoshka, tokenizer)
    refuse_unsupported(config, resolved, shape, pooler)
    image_processor = image_processor_for(resolved, shape) if shape.vision else None
    tp = start_tensor_parallel(config, resolved, dtype, device)
    device = tp.group.device if tp is not None else device  # a GPU per rank: this rank's
    try:
        loaded = _load(config, resolved, dtype, device, tp, pooler)
    except BaseException:
        if tp is not None:
            tp.close(polite=False)
        raise
    # Before the KV cache takes its pages: what loading left behind counts in no peak.
    give_back_loading_memory()
    runner = _model_runner(config, loaded, tokenizer, dtype, device, tp, pooler)
    if config.lora.enabled:
        targets = loaded.model.enable_lora(config.lora.max_loras, config.lora.max_lora_rank)
        arch = loaded.arch  # what a GGUF adapter is checked and read against
        base = LoraBase(arch.architecture, arch.num_heads, arch.num_kv_heads)
        runner.lora = LoraRegistry.start(config.lora, targets, base, mirror=tp)
    # Not claimed across ranks: an all-reduce's summation order may follow the tensor's size
    # (gloo's and NCCL's algorithms chunk by size), so by the batch.
    # Adapter rows: the CPU's native kernel (cpp/src/lora) sums each row in one fixed order,
    # invariant; elsewhere torch's batched matmuls (core/lora/weights.py), not claimed.
    invariant = (
        tp is None
        and (not config.lora.enabled or device.type == "cpu")
        and is_batch_invariant(loaded.model, attention, device)
    )
    task = "generate" if pooler is None else f"{pooler.task}: {pooler.describe()}"
    logger.info(
        "model %s (%s, task %s) on %s in %s, weights: %s, tensor_parallel_size %d, "
        "attention %s, %sbatch-invariant; %s",
        resolved.name, loaded.arch.architecture, task, device, dtype,
        loaded.weights, config.parallel.tensor_parallel_size, attention.name,
        "" if invariant else "not ", loaded.layout.describe(),
    )  # fmt: skip
    # An embedding request's prompt may fill the context: the placeholder token it "samples"
    # (never computed, never in the KV cache) is the one beyond.
    limit = loaded.max_model_len + (pooler is not None)
    scheduler = Scheduler.for_engine(config, loaded.layout.num_pages, limit)
    return EngineParts(
        resolved, tokenizer, chat_template, loaded.arch, runner,
        scheduler, loaded.max_model_len, loaded.layout, invariant,
        loaded.weights, pooler, loaded.model.has_lm_head, image_processor,
    )  # fmt: skip


def _load(
    config: EngineConfig,
    resolved: ResolvedModel,
    dtype: torch.dtype,
    device: torch.device,
    tp: TensorParallel | None,
    pooler: PoolerConfig | None,
) -> _Loaded:
    """The weights, packed for the linear path the policy picks, and the KV cache's size."""
    mc, page_size = config.model, config.cache.page_size
    group = tp.group if tp else None
    head_optional = pooler is not None and pooler.task == "embed"  # a reranker needs its head
    model, arch, weights = load_for_engine(
        config, resolved, dtype, device, group=group, head_optional=head_optional
    )
    max_model_len = resolve_max_model_len(mc.max_model_len, arch.max_position_embeddings)
    kv_dtype = kv_cache_dtype(config.cache.kv_cache_dtype, dtype, device)
    spec = ModelRunner.kv_spec(model.arch, page_size, kv_dtype)  # this rank's KV heads
    budget = kv_budget_bytes(config.cache, device)
    layout = size_kv_cache(spec, max_model_len, budget, config.cache.num_pages)
    if tp is not None:
        share_num_pages(tp.group, layout.num_pages)  # the same pages (page tables) on every rank
    return _Loaded(model, arch, weights, max_model_len, layout, kv_dtype)


def _model_runner(
    config: EngineConfig,
    loaded: _Loaded,
    tokenizer: Tokenizer,
    dtype: torch.dtype,
    device: torch.device,
    tp: TensorParallel | None,
    pooler: PoolerConfig | None,
) -> ModelRunner:
    num_pages, page_size = loaded.layout.num_pages, config.cache.page_size
    draft = None
    if config.speculative.speculative_method == "draft":
        draft = build_draft_model(config, tokenizer, dtype, device, num_pages)
    return ModelRunner(
        loaded.model, loaded.model.arch, num_pages=num_pages, page_size=page_size, dtype=dtype,
        device=device, vocab_size=tokenizer.vocab_size, eos_token_ids=tokenizer.eos_token_ids,
        tp=tp, pooler=pooler, draft=draft, kv_dtype=loaded.kv_dtype,
    )  # fmt: skip
