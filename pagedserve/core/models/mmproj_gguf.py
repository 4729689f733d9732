"""llama.cpp's multimodal projector GGUF (`--mmproj`): a vision tower and its preprocessing.

llama.cpp keeps a vision-language model in two files: the language model (a `qwen2vl` GGUF,
read by loader_gguf.py) and the projector its converter writes with `--mmproj`
(`general.architecture` "clip": `clip.*` metadata, `v.*` tower and `mm.*` merger tensors). This
module reads the second into what an HF folder gives: the VisionConfig, the tower's weights
under transformers' `visual.` names (q / k / v joined into qkv, the two frames of the patch
embedding stacked back into the Conv3d), and the image processor's parameters. Values the file
leaves out take llama.cpp's defaults (clip.cpp), so a file means here what it means there.
Projector types, keys and tensors we do not build are refused by name.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGUFReader, GGUFValueType

from pagedserve.core.gguf_reader import gguf_reader
from pagedserve.core.models.arch import ArchConfig, VisionConfig
from pagedserve.core.models.loader_gguf import to_numpy
from pagedserve.core.multimodal.processor import Qwen2VLImageProcessor

# clip.projector_type -> (the family it builds, the language model architecture it goes with).
PROJECTORS = {"qwen2.5vl_merger": ("qwen2_5_vl", "qwen2vl")}
IMAGE_TOKEN = "<|image_pad|>"  # the token Qwen2-VL's chat template writes once per image
# llama.cpp's Qwen2.5-VL defaults (clip.cpp): windows of 112 pixels, a 2 x 2 merger, images of
# 8 to 4096 tokens (llama-server's --image-min-tokens / --image-max-tokens).
DEFAULT_WINDOW, DEFAULT_MERGE, MIN_TOKENS, MAX_TOKENS = 112, 2, 8, 4096
_EPS = 1e-6  # the tower's RMSNorm epsilon (vision_qwen2_5.py), transformers' fixed value
_KEYS = frozenset({
    "clip.projector_type", "clip.has_vision_encoder", "clip.has_audio_encoder", "clip.use_silu",
    "clip.use_gelu", "clip.vision.projection_dim", "clip.vision.image_size",
    "clip.vision.patch_size", "clip.vision.embedding_length", "clip.vision.feed_forward_length",
    "clip.vision.block_count", "clip.vision.attention.head_count", "clip.vision.image_mean",
    "clip.vision.image_std", "clip.vision.n_wa_pattern", "clip.vision.window_size",
    "clip.vision.attention.layer_norm_epsilon", "clip.vision.spatial_merge_size",
    "clip.vision.image_min_pixels", "clip.vision.image_max_pixels",
})  # fmt: skip
_BLOCK_PARTS = {
    "attn_out": "attn.proj",
    "ln1": "norm1",
    "ln2": "norm2",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_QKV = ("attn_q", "attn_k", "attn_v")
_TOP_NAMES = {
    "v.post_ln.weight": "merger.ln_q.weight",
    "mm.0.weight": "merger.mlp.0.weight",
    "mm.0.bias": "merger.mlp.0.bias",
    "mm.2.weight": "merger.mlp.2.weight",
    "mm.2.bias": "merger.mlp.2.bias",
}
_PATCH = ("v.patch_embd.weight", "v.patch_embd.weight.1")  # the Conv3d's two frames
_BLOCK_RE = re.compile(r"v\.blk\.(\d+)\.(\w+)\.(weight|bias)")


@dataclass(frozen=True)
class Mmproj:
    """What a projector file says, before any weight is read."""

    path: Path
    family: str
    """The family the tower and the language model build together (qwen2_5_vl)."""
    language_model: str
    """The GGUF architecture of the language model it goes with."""
    vision: VisionConfig
    """The tower's shape; image_token_id is set from the language model's vocabulary."""
    image_mean: tuple[float, ...]
    image_std: tuple[float, ...]
    min_pixels: int
    max_pixels: int


def _value(reader: GGUFReader, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    if field is None:
        return default
    value = field.contents()
    return list(value) if field.types[0] == GGUFValueType.ARRAY else value


def _required(reader: GGUFReader, path: Path, key: str) -> Any:
    value = _value(reader, key)
    if value is None:
        raise ValueError(f"mmproj {path}: GGUF key {key!r} is missing")
    return value


def _check_file(reader: GGUFReader, path: Path) -> str:
    """The projector type, after refusing what is not a vision projector we build."""
    architecture = _value(reader, "general.architecture")
    if architecture != "clip":
        raise ValueError(f"mmproj {path} is not a projector file: general.architecture is "
                         f"{architecture!r}, llama.cpp's projectors say 'clip'")  # fmt: skip
    projector = _value(reader, "clip.projector_type")
    if projector not in PROJECTORS:
        raise ValueError(f"mmproj {path}: clip.projector_type {projector!r} is not supported "
                         f"(supported: {', '.join(PROJECTORS)})")  # fmt: skip
    for key in sorted(reader.fields):
        if key.startswith("clip.") and key not in _KEYS:
            raise ValueError(f"mmproj {path}: GGUF key {key!r} is not supported")
    if _value(reader, "clip.has_audio_encoder", False):
        raise ValueError(f"mmproj {path}: clip.has_audio_encoder: audio is not supported")
    if not _value(reader, "clip.has_vision_encoder", False):
        raise ValueError(f"mmproj {path}: clip.has_vision_encoder is not set: no vision tower")
    if _value(reader, "clip.use_gelu", False) or not _value(reader, "clip.use_silu", False):
        raise ValueError(f"mmproj {path}: the tower's MLP must be SiLU (clip.use_silu)")
    eps = float(_value(reader, "clip.vision.attention.layer_norm_epsilon", _EPS))
    if not math.isclose(eps, _EPS, rel_tol=1e-6):
        raise ValueError(f"mmproj {path}: clip.vision.attention.layer_norm_epsilon {eps} is "
                         f"not supported (the tower's norms use {_EPS})")  # fmt: skip
    return str(projector)


def _full_attention(depth: int, pattern: int) -> tuple[int, ...]:
    """llama.cpp's n_wa_pattern: block i sees the whole image iff (i + 1) % pattern == 0; 0 or
    no key: every block does."""
    return tuple(i for i in range(depth) if not pattern or (i + 1) % pattern == 0)


def read_mmproj(path: Path) -> Mmproj:
    """The projector's metadata; ValueError naming the file and the key it cannot take."""
    reader = gguf_reader(path)
    projector = _check_file(reader, path)
    family, language_model = PROJECTORS[projector]

    def need(key: str) -> int:
        return int(_required(reader, path, f"clip.vision.{key}"))

    depth, patch = need("block_count"), need("patch_size")
    merge = int(_value(reader, "clip.vision.spatial_merge_size", DEFAULT_MERGE))
    names = {t.name for t in reader.tensors}
    if not set(_PATCH) <= names:
        raise ValueError(f"mmproj {path}: the patch embedding needs both {' and '.join(_PATCH)}")
    vision = VisionConfig(
        depth=depth,
        hidden_size=need("embedding_length"),
        num_heads=need("attention.head_count"),
        intermediate_size=need("feed_forward_length"),
        out_hidden_size=need("projection_dim"),
        patch_size=patch,
        temporal_patch_size=len(_PATCH),
        spatial_merge_size=merge,
        window_size=int(_value(reader, "clip.vision.window_size", DEFAULT_WINDOW)),
        fullatt_block_indexes=_full_attention(depth, int(need("n_wa_pattern"))),
    )
    area = (patch * merge) ** 2  # the pixels of one token
    return Mmproj(
        path=path, family=family, language_model=language_model, vision=vision,
        image_mean=tuple(float(x) for x in _required(reader, path, "clip.vision.image_mean")),
        image_std=tuple(float(x) for x in _required(reader, path, "clip.vision.image_std")),
        min_pixels=int(_value(reader, "clip.vision.image_min_pixels", MIN_TOKENS * area)),
        max_pixels=int(_value(reader, "clip.vision.image_max_pixels", MAX_TOKENS * area)),
    )  # fmt: skip


def image_token_id(lm: GGUFReader, lm_path: Path) -> int:
    """The id of the token the chat template writes for an image, from the LM's vocabulary."""
    field = lm.fields.get("tokenizer.ggml.tokens")
    tokens = field.contents() if field is not None else []
    if IMAGE_TOKEN not in tokens:
        raise ValueError(f"{lm_path}: the vocabulary has no {IMAGE_TOKEN} token for images")
    return int(tokens.index(IMAGE_TOKEN))


def with_vision(arch: ArchConfig, lm: GGUFReader, lm_path: Path, mmproj: Mmproj) -> ArchConfig:
    """The language model's shape joined with the projector's tower: refused, by name, where
    the two do not go together."""
    architecture = _value(lm, "general.architecture")
    if architecture != mmproj.language_model:
        raise ValueError(
            f"mmproj {mmproj.path} is a vision projector for a {mmproj.language_model!r} "
            f"language model; {lm_path} is a text-only {architecture!r} model"
        )
    if mmproj.vision.out_hidden_size != arch.hidden_size:
        raise ValueError(
            f"mmproj {mmproj.path}: clip.vision.projection_dim {mmproj.vision.out_hidden_size} "
            f"differs from {lm_path}'s hidden size {arch.hidden_size}: not the same model"
        )
    vision = replace(mmproj.vision, image_token_id=image_token_id(lm, lm_path))
    return replace(arch, architecture=mmproj.family, vision=vision)


def mmproj_image_processor(mmproj: Mmproj, image_token_id: int) -> Qwen2VLImageProcessor:
    """Qwen2-VL's processor on the projector's patch, merge, pixel bounds, mean and std (no
    preprocessor_config.json: llama.cpp's file holds what it needs)."""
    vision = mmproj.vision
    return Qwen2VLImageProcessor(
        image_token_id, patch_size=vision.patch_size,
        temporal_patch_size=vision.temporal_patch_size, merge_size=vision.spatial_merge_size,
        min_pixels=mmproj.min_pixels, max_pixels=mmproj.max_pixels,
        mean=mmproj.image_mean, std=mmproj.image_std,
    )  # fmt: skip


def _hf_name(name: str, path: Path) -> str:
    """The tower's parameter (under `visual.`) a projector tensor is, or a part of (qkv)."""
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    match = _BLOCK_RE.fullmatch(name)
    if match is not None and match.group(2) in _QKV:
        return f"blocks.{match.group(1)}.attn.qkv.{match.group(3)}"
    if match is None or match.group(2) not in _BLOCK_PARTS:
        raise ValueError(f"mmproj {path}: tensor {name!r} is not part of a supported tower")
    layer, part, kind = match.groups()
    return f"blocks.{layer}.{_BLOCK_PARTS[part]}.{kind}"


def count_mmproj_weights(mmproj: Mmproj) -> int:
    """How many weights iter_mmproj_weights yields."""
    reader = gguf_reader(mmproj.path)
    names = {_hf_name(t.name, mmproj.path) for t in reader.tensors if t.name not in _PATCH}
    return len(names) + 1  # + the patch embedding


def iter_mmproj_weights(mmproj: Mmproj) -> Iterator[tuple[str, torch.Tensor]]:
    """(transformers' name, float32 tensor) for every weight of the tower: q, k and v joined
    in that order into qkv, the patch embedding's frames stacked along time, as the converter
    split them."""
    reader = gguf_reader(mmproj.path)
    qkv: dict[str, dict[str, np.ndarray]] = {}
    frames: dict[str, np.ndarray] = {}
    for tensor in reader.tensors:
        data = to_numpy(tensor)
        if tensor.name in _PATCH:
            frames[tensor.name] = data  # [hidden, channels, patch, patch] each
            if len(frames) == len(_PATCH):
                stacked = np.stack([frames[name] for name in _PATCH], axis=2)
                yield "visual.patch_embed.proj.weight", torch.from_numpy(stacked)
            continue
        name = _hf_name(tensor.name, mmproj.path)
        if ".attn.qkv." not in name:
            yield "visual." + name, torch.from_numpy(np.require(data, requirements=["C", "W"]))
            continue
        parts = qkv.setdefault(name, {})
        parts[tensor.name.split(".")[3]] = data  # v.blk.{i}.attn_q.weight: attn_q
        if len(parts) == len(_QKV):
            joined = np.concatenate([parts[p] for p in _QKV], axis=0)
            yield "visual." + name, torch.from_numpy(joined)
            del qkv[name]
    if qkv:
        raise ValueError(f"mmproj {mmproj.path}: q, k or v missing in {sorted(qkv)}")
