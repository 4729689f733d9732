"""load_model: resolved model -> (nn.Module with real weights, ArchConfig).

Loaders yield weights under HF names; this module renames them to the model's fused layout
(q/k/v -> qkv_proj, gate/up -> gate_up_proj), casts each to the target dtype as it arrives, and
assigns them into a model built on the meta device, so weights are never initialized twice.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterator

import torch
from tqdm import tqdm

from pagedserve.core.attention.base import AttentionBackend
from pagedserve.core.distributed.group import TPGroup
from pagedserve.core.gguf_reader import release_mapped_pages
from pagedserve.core.models import loader_gguf, loader_safetensors
from pagedserve.core.models.arch import ArchConfig
from pagedserve.core.models.families import FAMILIES, family
from pagedserve.core.models.gemma3_vl import Gemma3ForConditionalGeneration
from pagedserve.core.models.linear.quantized import QuantizedPlan, plan_quantized
from pagedserve.core.models.llama import LlamaForCausalLM
from pagedserve.core.models.mmproj_gguf import (
    count_mmproj_weights,
    iter_mmproj_weights,
    mmproj_image_processor,
    read_mmproj,
    with_vision,
)
from pagedserve.core.models.qwen2_5_vl import Qwen2_5_VLForConditionalGeneration
from pagedserve.core.models.resolve import ResolvedModel
from pagedserve.core.models.tensor_parallel import parallelize, shard_arch, shard_weight
from pagedserve.core.multimodal.processor import ImageProcessor, load_image_processor

MODEL_CLASSES: dict[str, type[LlamaForCausalLM]] = {name: LlamaForCausalLM for name in FAMILIES}
MODEL_CLASSES["qwen2_5_vl"] = Qwen2_5_VLForConditionalGeneration
MODEL_CLASSES["gemma3"] = Gemma3ForConditionalGeneration

# Llama-style HF suffix inside a layer -> (our parameter, index of this part, number of parts)
_LAYER_PARTS = {
    "input_layernorm.weight": ("input_layernorm", 0, 1),
    "post_attention_layernorm.weight": ("post_attention_layernorm", 0, 1),
    "post_attn_norm.weight": ("post_attn_norm", 0, 1),
    "post_mlp_norm.weight": ("post_mlp_norm", 0, 1),
    "self_attn.q_proj.weight": ("qkv_proj.weight", 0, 3),
    "self_attn.k_proj.weight": ("qkv_proj.weight", 1, 3),
    "self_attn.v_proj.weight": ("qkv_proj.weight", 2, 3),
    "self_attn.q_proj.bias": ("qkv_proj.bias", 0, 3),
    "self_attn.k_proj.bias": ("qkv_proj.bias", 1, 3),
    "self_attn.v_proj.bias": ("qkv_proj.bias", 2, 3),
    "self_attn.qkv_proj.weight": ("qkv_proj.weight", 0, 1),  # Phi-3 stores it fused
    "self_attn.q_norm.weight": ("q_norm", 0, 1),
    "self_attn.k_norm.weight": ("k_norm", 0, 1),
    "self_attn.o_proj.weight": ("o_proj.weight", 0, 1),
    "self_attn.o_proj.bias": ("o_proj.bias", 0, 1),
    "mlp.gate.weight": ("mlp.router.weight", 0, 1),
    "mlp.shared_expert_gate.weight": ("mlp.shared_expert_gate.weight", 0, 1),
}
# Inside any gated MLP (the dense one, an expert, the shared expert).
_MLP_PARTS = {
    "gate_proj.weight": ("gate_up_proj.weight", 0, 2),
    "up_proj.weight": ("gate_up_proj.weight", 1, 2),
    "gate_up_proj.weight": ("gate_up_proj.weight", 0, 1),  # Phi-3 stores it fused
    "down_proj.weight": ("down_proj.weight", 0, 1),
}
_MLP_RE = re.compile(r"(mlp\.(?:experts\.\d+\.|shared_expert\.)?)(\w+\.weight)")
_MIXTRAL_EXPERT_RE = re.compile(r"block_sparse_moe\.experts\.(\d+)\.w([123])\.weight")
_MIXTRAL_PROJ = {"1": "gate_proj", "2": "down_proj", "3": "up_proj"}
_TOP_PARTS = {
    "model.embed_tokens.weight": "embed_tokens.weight",
    "model.norm.weight": "norm",
    "lm_head.weight": "lm_head.weight",
}
_LAYER_RE = re.compile(r"model\.layers\.(\d+)\.(.+)")
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
# A vision checkpoint's prefix -> ours (longest first: Gemma 3's tower under its old and new
# names, its projector).
_VISION_PREFIXES = {
    "model.visual.": "visual.",
    "visual.": "visual.",
    "model.vision_tower.vision_model.": "visual.",
    "vision_tower.vision_model.": "visual.",
    "model.vision_tower.": "visual.",
    "vision_tower.": "visual.",
    "model.multi_modal_projector.": "projector.",
    "multi_modal_projector.": "projector.",
}
_NORMS = ("layernorm", "_norm", "norm")  # our names of the RMSNorm weights


def _canonical(suffix: str, renames: dict[str, str]) -> str:
    """A layer's HF suffix in Llama's words (Mixtral's block_sparse_moe / w1 w2 w3 included)."""
    suffix = renames.get(suffix, suffix)
    expert = _MIXTRAL_EXPERT_RE.fullmatch(suffix)
    if expert is not None:
        return f"mlp.experts.{expert.group(1)}.{_MIXTRAL_PROJ[expert.group(2)]}.weight"
    if suffix.startswith("block_sparse_moe."):
        return "mlp." + suffix.removeprefix("block_sparse_moe.")
    return suffix


def _layer_part(suffix: str) -> tuple[str, int, int] | None:
    if suffix in _LAYER_PARTS:
        return _LAYER_PARTS[suffix]
    match = _MLP_RE.fullmatch(suffix)
    if match is None or match.group(2) not in _MLP_PARTS:
        return None
    name, index, num_parts = _MLP_PARTS[match.group(2)]
    return match.group(1) + name, index, num_parts


def _target(hf_name: str, renames: dict[str, str]) -> tuple[str, int, int] | None:
    # A vision-language checkpoint: the tower's weights keep their names under visual.; the
    # language model's are Llama's (transformers 5 nests them under model.language_model.).
    for prefix, ours in _VISION_PREFIXES.items():
        if hf_name.startswith(prefix):
            return ours + hf_name.removeprefix(prefix), 0, 1
    if hf_name.startswith("model.language_model."):
        hf_name = "model." + hf_name.removeprefix("model.language_model.")
    elif hf_name.startswith("language_model."):  # Gemma 3's language_model.model. / .lm_head.
        hf_name = hf_name.removeprefix("language_model.")
    if not hf_name.startswith(("model.", "lm_head.")):
        hf_name = "model." + hf_name  # a bare backbone's checkpoint (Qwen3Model, embedders)
    if hf_name in _TOP_PARTS:
        return _TOP_PARTS[hf_name], 0, 1
    if hf_name.endswith(_IGNORED_SUFFIXES):
        return None
    match = _LAYER_RE.fullmatch(hf_name)
    part = None if match is None else _layer_part(_canonical(match.group(2), renames))
    if match is None or part is None:
        raise ValueError(f"weight {hf_name!r} does not belong to a supported model")
    name, index, num_parts = part
    return f"layers.{match.group(1)}.{name}", index, num_parts


def _is_norm(name: str) -> bool:
    return name.rsplit(".", 1)[-1].endswith(_NORMS)


def fuse_weights(
    weights: Iterator[tuple[str, torch.Tensor]],
    dtype: torch.dtype,
    device: torch.device,
    arch: ArchConfig | None = None,
    shard: Callable[[str, torch.Tensor], torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """Our state dict from HF-named weights; parts of a fused weight are concatenated along
    dim 0 in _LAYER_PARTS order once all of them have arrived. The family's renames apply,
    and its norm offset (Gemma's 1 + weight) is folded into the norm weights in float32.
    `shard` (tensor parallel) cuts each whole weight to this rank's part before it moves to
    the device."""
    keep = shard or (lambda _name, tensor: tensor)
    renames = family(arch.architecture).renames if arch is not None else {}
    offset = arch.norm_offset if arch is not None else 0.0
    state: dict[str, torch.Tensor] = {}
    pending: dict[str, list[torch.Tensor | None]] = {}
    for hf_name, tensor in weights:
        target = _target(hf_name, renames)
        if target is None:
            continue
        name, index, num_parts = target
        if offset and _is_norm(name):
            tensor = tensor.float() + offset
        tensor = tensor.to(dtype)
        if num_parts == 1:
            state[name] = keep(name, tensor).to(device)
            continue
        parts = pending.setdefault(name, [None] * num_parts)
        parts[index] = tensor
        if all(p is not None for p in parts):
            state[name] = keep(name, torch.cat(parts, dim=0)).to(device)  # type: ignore[arg-type]
            del pending[name]
    if pending:
        raise ValueError(f"incomplete fused weights (some parts missing): {sorted(pending)}")
    return state


def _open_weights(
    resolved: ResolvedModel, quantized: QuantizedPlan | None = None
) -> tuple[ArchConfig, Iterator[tuple[str, torch.Tensor]], int]:
    if resolved.format == "gguf":
        arch, reader = loader_gguf.open_gguf(resolved.path)
        skip = quantized.kept if quantized is not None else frozenset()
        weights = loader_gguf.iter_gguf_weights(reader, arch, skip)
        count = loader_gguf.count_gguf_weights(reader, arch.num_experts, skip)
        if resolved.mmproj is None:
            return arch, weights, count
        mmproj = read_mmproj(resolved.mmproj)  # the vision tower: llama.cpp's second file
        arch = with_vision(arch, reader, resolved.path, mmproj)
        tower = iter_mmproj_weights(mmproj)
        return arch, itertools.chain(weights, tower), count + count_mmproj_weights(mmproj)
    if resolved.format == "hf":
        arch = loader_safetensors.read_arch(resolved.path)
        files = loader_safetensors.safetensors_files(resolved.path)
        weights = loader_safetensors.iter_safetensors_weights(files)
        return arch, weights, loader_safetensors.count_safetensors_weights(files)
    raise ValueError(f"model format must be 'gguf' or 'hf', got {resolved.format!r}")


def read_arch(resolved: ResolvedModel) -> ArchConfig:
    """The model's shape, without reading its weights."""
    return _open_weights(resolved)[0]


def image_processor_for(resolved: ResolvedModel, arch: ArchConfig) -> ImageProcessor:
    """The image processor of a model that takes images: an HF folder's files, or a GGUF
    model's projector (`--mmproj`) metadata."""
    if resolved.mmproj is None:
        return load_image_processor(resolved.path)
    assert arch.vision is not None, "read_arch joined the projector's tower"
    return mmproj_image_processor(read_mmproj(resolved.mmproj), arch.vision.image_token_id)


def load_model(
    resolved: ResolvedModel,
    *,
    dtype: torch.dtype,
    device: torch.device,
    attention: AttentionBackend,
    max_positions: int | None = None,
    progress: bool = True,
    group: TPGroup | None = None,
    quantization: str = "none",
    pack: bool = True,
    head_optional: bool = False,
) -> tuple[LlamaForCausalLM, ArchConfig]:
    """The model in eval mode without gradients, weights in `dtype` on `device`.

    max_positions bounds the rotary tables (default: the model's max_position_embeddings).
    With a tensor-parallel `group`, this rank's shard (models/tensor_parallel.py); model.arch
    is then the rank's shape, the returned ArchConfig the whole model's.
    quantization "auto" keeps a GGUF's quantized linears quantized where a kernel exists
    (models/linear/quantized.py; what runs is in model.quantization), "none" dequantizes everything;
    tensor-parallel shards are dequantized (the quantized layers are not sharded).
    pack=False leaves model.pack_weights() to the caller (device_policy.pack_for_dispatch, which
    first decides whether the weights stay unpacked too: models/linear/dispatch.py).
    head_optional: an embedding checkpoint without lm_head.weight (a bare backbone) loads,
    with model.has_lm_head False (the embeddings stand in, so the module stays whole; the
    engine refuses to sample from it).
    """
    plan = None
    if quantization == "auto" and resolved.format == "gguf" and group is None:
        arch, reader = loader_gguf.open_gguf(resolved.path)
        plan = plan_quantized(reader, arch, dtype=dtype, device=device)
    arch, weights, num_weights = _open_weights(resolved, plan)
    tp = group.world_size if group is not None else 1
    with torch.device("meta"):
        model = MODEL_CLASSES[arch.architecture](
            shard_arch(arch, tp), attention, dtype=dtype, device=device, max_positions=max_positions
        )
        if group is not None:
            parallelize(model, group)
    if plan is not None:
        plan.install(model)
        model.quantization = plan.describe()
    bar = tqdm(
        weights,
        total=num_weights,
        desc=f"Loading {resolved.name}",
        unit="tensor",
        disable=not progress,
    )
    shard = None
    if group is not None:
        rank = group.rank
        shard = lambda name, w: shard_weight(name, w, arch, rank, tp)  # noqa: E731
    state = fuse_weights(iter(bar), dtype, device, arch, shard)
    head_kept_quantized = plan is not None and plan.keeps_lm_head
    tied = arch.tie_word_embeddings and not head_kept_quantized
    if arch.tie_word_embeddings:
        state.pop("lm_head.weight", None)  # some checkpoints store the tied copy too
    headless = not tied and not head_kept_quantized and "lm_head.weight" not in state
    if headless and not head_optional:
        raise ValueError(
            f"{resolved.name} has no LM head (lm_head.weight): a bare backbone such as "
            "Qwen3Model cannot generate; serve it with task embed (--task embed)"
        )
    if tied or headless:
        state["lm_head.weight"] = state["embed_tokens.weight"]
    model.has_lm_head = not headless
    model.load_state_dict(state, strict=True, assign=True)
    if tied:
        model.tie_weights()
    model.requires_grad_(False)
    if pack:
        model.pack_weights()
    if resolved.format == "gguf":
        release_mapped_pages(resolved.path)  # every weight is a copy by now
    if resolved.mmproj is not None:
        release_mapped_pages(resolved.mmproj)
    return model.eval(), arch
