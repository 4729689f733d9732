"""The device and CPU policy: the one place that decides where and how the model runs.

    level = apply_cpu_isa(config.cpu_isa)             # --cpu-isa: the native kernels' ISA level
    device = choose_device(config.device)             # --device auto: CUDA when torch sees one
    dtype = choose_dtype(config.dtype, device, quantized)   # --dtype auto, by level and kernels
    summary = pack_for_dispatch(model, config, dtype, device, tensor_parallel=False)
    invariant = is_batch_invariant(model, attention, device)  # what --deterministic gives

The ISA levels themselves (names, the CPU's features, forcing a level) are ops/cpu_features.py's,
the kernels' own paths the ops' (`cpu_attention_path`, `quant_linear_path`, ...), and the
dense linear's calibration models/linear/dispatch.py's; what is decided from them lives here.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

import torch

from pagedserve.core.attention.base import AttentionBackend
from pagedserve.core.attention.ops import cpu_attention_path
from pagedserve.core.attention.registry import get_attention_backend
from pagedserve.core.config import CacheConfig, EngineConfig, ModelConfig
from pagedserve.core.distributed.group import TPGroup
from pagedserve.core.models import load_model
from pagedserve.core.models.arch import ArchConfig
from pagedserve.core.models.base import CausalLM
from pagedserve.core.models.linear.dense import PackableLinear
from pagedserve.core.models.linear.dispatch import (
    DispatchInputs,
    calibration_rows,
    plan_dispatch,
    quantized_amx_choice,
    tiles_agree_with_avx512,
)
from pagedserve.core.models.linear.quantized import (
    QuantizedGateUpLinear,
    QuantizedLinear,
    plan_quantized,
)
from pagedserve.core.models.loader_gguf import open_gguf
from pagedserve.core.models.resolve import ResolvedModel
from pagedserve.core.ops.cpu_features import cpu_isa, cpu_isa_supported, isa_at_least, set_cpu_isa
from pagedserve.core.ops.linear import amx_available, native_linear_available
from pagedserve.core.ops.linear_quant import quant_linear_path_for

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


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


def cpu_kernels(
    deterministic: bool, quantized: bool, dtype: torch.dtype, activations: str = "int8"
) -> str:
    """The start-up line's CPU kernels, e.g. "cpu kernels: isa avx2 (attention avx2, int16
    linear avx2)" (the quantized kernel's path with these activations, only for weights kept
    quantized), and what --deterministic means at that level."""
    attention = cpu_attention_path()
    linear = f", {activations} linear {quant_linear_path_for(activations)}" if quantized else ""
    text = f"cpu kernels: isa {cpu_isa()} (attention {attention}{linear})"
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


SMALL_MODEL_PARAMETERS = 1_000_000_000
"""Below this many parameters --quantized-activations auto is int16: resolve_quantized_activations."""


def resolve_quantized_activations(
    config: EngineConfig, resolved: ResolvedModel, device: torch.device
) -> EngineConfig:
    """--quantized-activations auto made concrete: int16 for a GGUF model under
    SMALL_MODEL_PARAMETERS whose every linear stays quantized on the CPU, else int8. Why: the
    default model (SmolLM2-135M, Q4_1) does not survive int8 activations: its greedy tokens
    part from transformers' fp32 ones on the dequantized weights on 7 of 8 prompts and it
    answers "What is the capital of France?" with "L'Étoile, la Marseillaise, ..."; with int16
    (and fp32 storage, choose_model_dtype) it gives them on 8 of 8 (bench/RESULTS.md,
    bench/engine/default_precision.py). Larger models keep int8, llama.cpp's choice at every
    size: the 1B line is a choice, not a measurement."""
    mc = config.model
    if mc.quantized_activations != "auto":
        return config
    small = (
        device.type == "cpu"
        and every_linear_quantized(resolved, mc, config.parallel.tensor_parallel_size > 1)
        and gguf_parameters(resolved) < SMALL_MODEL_PARAMETERS
    )
    model = replace(mc, quantized_activations="int16" if small else "int8")
    return replace(config, model=model)


def gguf_parameters(resolved: ResolvedModel) -> int:
    """The GGUF's tensor elements (its parameters)."""
    _, reader = open_gguf(resolved.path)
    return sum(int(t.n_elements) for t in reader.tensors)


def choose_model_dtype(
    config: EngineConfig, resolved: ResolvedModel, device: torch.device
) -> torch.dtype:
    """--dtype for this model: float32 on the precise quantized path (precise_quantized), whose
    precision bf16 storage between the layers would lose (bench/RESULTS.md: bf16 storage alone
    parts from fp32 on 3 of 8 prompts); else choose_dtype, told whether every linear stays
    quantized (on a CPU without bf16 dot products, bf16 storage pays from avx2 only then or on
    the dense kernels)."""
    if precise_quantized(config, resolved, device):
        return torch.float32
    mc = config.model
    quantized = (
        mc.dtype == "auto"
        and device.type == "cpu"
        and not cpu_has_bf16()
        and every_linear_quantized(resolved, mc, config.parallel.tensor_parallel_size > 1)
    )
    return choose_dtype(mc.dtype, device, quantized)


def precise_quantized(config: EngineConfig, resolved: ResolvedModel, device: torch.device) -> bool:
    """--dtype auto on a CPU model whose every linear stays quantized and multiplies int16 or
    float activations (config resolved by resolve_quantized_activations): the default model's
    path, float32 between the layers and fp16 KV pages."""
    mc = config.model
    assert mc.quantized_activations != "auto", "resolve_quantized_activations first"
    return (
        mc.dtype == "auto"
        and device.type == "cpu"
        and mc.quantized_activations in ("int16", "float")
        and every_linear_quantized(resolved, mc, config.parallel.tensor_parallel_size > 1)
    )


def resolve_kv_cache_dtype(
    config: EngineConfig, resolved: ResolvedModel, device: torch.device
) -> EngineConfig:
    """--kv-cache-dtype auto made concrete: fp16 on the precise quantized path (its float32
    model would otherwise store float32 pages), else auto (the model's dtype). fp16 pages keep
    the default model's greedy tokens equal to transformers' fp32 ones on 8 of 8 prompts, where
    bf16 pages part on 1 and int8 ones on 3 (bench/RESULTS.md), at half float32's bytes: the
    pages a --kv-cache-memory holds double, and decode attention reads half as much."""
    if config.cache.kv_cache_dtype != "auto" or not precise_quantized(config, resolved, device):
        return config
    return replace(config, cache=replace(config.cache, kv_cache_dtype="fp16"))


def every_linear_quantized(resolved: ResolvedModel, mc: ModelConfig, tensor_parallel: bool) -> bool:
    """The CPU model will run every linear on the quantized kernels (quantization auto, a GGUF
    whose every linear has a kernel, no tensor parallelism: shards are dequantized, no --mmproj
    projector: its vision tower's linears are dense)."""
    if mc.quantization != "auto" or resolved.format != "gguf" or tensor_parallel:
        return False
    if resolved.mmproj is not None:
        return False
    arch, reader = open_gguf(resolved.path)
    plan = plan_quantized(reader, arch, dtype=torch.float32, device=torch.device("cpu"), quiet=True)
    return plan.every_linear_kept


def pack_for_dispatch(
    model: CausalLM,
    config: EngineConfig,
    dtype: torch.dtype,
    device: torch.device,
    *,
    tensor_parallel: bool,
) -> str:
    """Pack the weights for the CPU linear path ModelConfig.cpu_linear picks (a calibration
    for auto: models/linear/dispatch.py) and route the steps; what runs, "" off the CPU."""
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
    # AMX-INT8 tiles take int8 activation rows and int16 ones (two tile products); float rows
    # never reach them. The activations are set first, so the calibration times what runs.
    if model.quantization and mc.quantized_activations != "int8":
        model.use_quantized_activations(mc.quantized_activations)
    tiles = bool(model.quantization) and mc.quantized_activations in ("int8", "int16")
    int8_from, int8_note = quantized_amx_choice(
        list(layers[0].modules()) if layers and tiles else [],
        calibration_rows(config.scheduler.max_num_batched_tokens),
        dtype,
    )
    model.use_amx(dispatch.amx_from, int8_from, dispatch.amx_tile_order)
    if model.quantization and mc.quantized_activations != "int8":
        note = f"{mc.quantized_activations} activations"
        int8_note = "; ".join(n for n in (int8_note, note) if n)
    if int8_note:
        dispatch = replace(dispatch, summary=f"{dispatch.summary}; quantized kernel: {int8_note}")
    logger.info(
        "%s (decided in %.2f s)%s",
        dispatch.summary,
        time.perf_counter() - start,
        f"; the unpacked weights kept for torch take {kept / 2**20:.1f} MiB more" if kept else "",
    )
    return dispatch.summary


def load_for_engine(
    config: EngineConfig,
    resolved: ResolvedModel,
    dtype: torch.dtype,
    device: torch.device,
    *,
    group: TPGroup | None = None,
    head_optional: bool = False,
    progress: bool = True,
) -> tuple[CausalLM, ArchConfig, str]:
    """The one way a served model is loaded (the target, its draft, every tensor-parallel
    rank): models.load_model with the configured quantization, then packed for the linear path
    this policy picks; returns the model, the whole model's shape and what runs the weights
    (the start-up line's "weights", /v1/models')."""
    mc = config.model
    # max_positions: the rope tables' length, and longrope's short/long choice (llama.cpp's:
    # long factors only when the served context exceeds the original one).
    model, arch = load_model(
        resolved, dtype=dtype, device=device,
        attention=get_attention_backend(mc.attention_backend, mc.deterministic),
        max_positions=mc.max_model_len, progress=progress, group=group,
        quantization=mc.quantization, pack=False, head_optional=head_optional,
    )  # fmt: skip
    linears = pack_for_dispatch(model, config, dtype, device, tensor_parallel=group is not None)
    weights = model.quantization or str(dtype).removeprefix("torch.")
    weights += f"; {linears}" if linears else ""
    if device.type == "cpu":
        quantized = bool(model.quantization)
        kernels = cpu_kernels(mc.deterministic, quantized, dtype, model.quantized_activations)
        weights += f"; {kernels}"
    return model, arch, weights


def is_batch_invariant(model: CausalLM, attention: AttentionBackend, device: torch.device) -> bool:
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


def kv_budget_bytes(cache: CacheConfig, device: torch.device) -> int:
    """The KV cache's memory budget: a share of the GPU's free memory, or --kv-cache-memory."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free * cache.gpu_memory_utilization)
    return int(cache.kv_cache_memory * (1 << 30))
