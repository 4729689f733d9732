"""llama.cpp's multimodal projector GGUF (`--mmproj`): a vision tower and its preprocessing.

llama.cpp keeps a vision-language model in two files: the language model (a `qwen2vl` or
`gemma3` GGUF, read by loader_gguf.py) and the projector its converter writes with `--mmproj`
(`general.architecture` "clip": `clip.*` metadata, `v.*` tower and `mm.*` projector tensors).
This module reads the second into what an HF folder gives: the VisionConfig, the tower's
weights under transformers' names, and the image processor's parameters. Two projector types:

- `qwen2.5vl_merger` (Qwen2.5-VL): weights under `visual.`, q / k / v joined into qkv, the two
  frames of the patch embedding stacked back into the Conv3d;
- `gemma3` (Gemma 3): the SigLIP tower under `vision_tower.vision_model.` and the projector
  under `multi_modal_projector.`, as Google's checkpoints name them; its soft embedding norm
  holds 1 + weight (the converter adds the 1, as for the language model's norms, so the model
  reads it with ArchConfig.norm_offset 0). Its patch grid is pooled by
  `clip.vision.projector.scale_factor` per side (llama.cpp's default 4: 256 tokens).

Values the file leaves out take llama.cpp's defaults (clip.cpp), so a file means here what it
means there. Projector types, keys and tensors we do not build are refused by name.
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
from pagedserve.core.multimodal import gemma3
from pagedserve.core.multimodal.processor import ImageProcessor, Qwen2VLImageProcessor


@dataclass(frozen=True)
class Projector:
    """What one clip.projector_type builds."""

    family: str
    """The family the tower and the language model build together."""
    language_model: str
    """The GGUF architecture of the language model it goes with."""
    activation: str
    """The clip.use_* key the tower's MLP needs (SiLU or GELU, tanh-approximated)."""
    image_token: str
    """The token the processor expands into an image's tokens, from the LM's vocabulary."""
    keys: frozenset[str]
    """The clip.* keys beyond the common ones that it takes."""


_COMMON_KEYS = frozenset({
    "clip.projector_type", "clip.has_vision_encoder", "clip.has_audio_encoder", "clip.use_silu",
    "clip.use_gelu", "clip.vision.projection_dim", "clip.vision.image_size",
    "clip.vision.patch_size", "clip.vision.embedding_length", "clip.vision.feed_forward_length",
    "clip.vision.block_count", "clip.vision.attention.head_count", "clip.vision.image_mean",
    "clip.vision.image_std", "clip.vision.attention.layer_norm_epsilon",
})  # fmt: skip
PROJECTORS = {
    "qwen2.5vl_merger": Projector(
        "qwen2_5_vl", "qwen2vl", "clip.use_silu", "<|image_pad|>",
        frozenset({"clip.vision.n_wa_pattern", "clip.vision.window_size",
                   "clip.vision.spatial_merge_size", "clip.vision.image_min_pixels",
                   "clip.vision.image_max_pixels"}),
    ),
    "gemma3": Projector(
        "gemma3", "gemma3", "clip.use_gelu", gemma3.IMAGE,
        frozenset({"clip.vision.projector.scale_factor"}),
    ),
}  # fmt: skip
# llama.cpp's Qwen2.5-VL defaults (clip.cpp): windows of 112 pixels, a 2 x 2 merger, images of
# 8 to 4096 tokens (llama-server's --image-min-tokens / --image-max-tokens).
DEFAULT_WINDOW, DEFAULT_MERGE, MIN_TOKENS, MAX_TOKENS = 112, 2, 8, 4096
_ACTIVATIONS = {"clip.use_silu": "SiLU", "clip.use_gelu": "GELU"}
GEMMA3_DEFAULT_POOL = 4  # llama.cpp's Gemma 3: the patch grid pooled 4 x 4 (every real model)
_EPS = 1e-6  # the tower's norm epsilon: llama.cpp's default; Qwen's RMSNorm takes only this
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
# Gemma 3: the projector's tensors and SigLIP's, under the names of Google's checkpoints.
_SIGLIP = "vision_tower.vision_model."
_GEMMA3_TOP_NAMES = {
    "mm.input_projection.weight": "multi_modal_projector.mm_input_projection_weight",
    "mm.soft_emb_norm.weight": "multi_modal_projector.mm_soft_emb_norm.weight",
    "v.patch_embd.weight": _SIGLIP + "embeddings.patch_embedding.weight",
    "v.patch_embd.bias": _SIGLIP + "embeddings.patch_embedding.bias",
    "v.position_embd.weight": _SIGLIP + "embeddings.position_embedding.weight",
    "v.post_ln.weight": _SIGLIP + "post_layernorm.weight",
    "v.post_ln.bias": _SIGLIP + "post_layernorm.bias",
}
_SIGLIP_BLOCK_PARTS = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_out": "self_attn.out_proj", "ln1": "layer_norm1", "ln2": "layer_norm2",
    "ffn_up": "mlp.fc1", "ffn_down": "mlp.fc2",
}  # fmt: skip
_MLP_SWAP = {"ffn_up": "ffn_down", "ffn_down": "ffn_up"}


@dataclass(frozen=True)
class Mmproj:
    """What a projector file says, before any weight is read."""

    path: Path
    projector: Projector
    vision: VisionConfig
    """The tower's shape; image_token_id is set from the language model's vocabulary."""
    image_mean: tuple[float, ...]
    image_std: tuple[float, ...]
    min_pixels: int = 0
    max_pixels: int = 0
    """Qwen2.5-VL: the bounds of an image's area (Gemma 3 resizes every image to one size)."""

    @property
    def family(self) -> str:
        return self.projector.family


def _value(reader: GGUFReader, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    if field is None:
        return default
    value = field.contents()
    return list(value) if field.types[0] == GGUFValueType.ARRAY else value


def _decimal(value: float) -> float:
    """A float32 key as the shortest decimal that is that float32 (1e-06, as config.json says,
    not 9.99999997e-07)."""
    return float(str(np.float32(value)))


def _required(reader: GGUFReader, path: Path, key: str) -> Any:
    value = _value(reader, key)
    if value is None:
        raise ValueError(f"mmproj {path}: GGUF key {key!r} is missing")
    return value


def _check_file(reader: GGUFReader, path: Path) -> Projector:
    """The projector type, after refusing what is not a vision projector we build."""
    architecture = _value(reader, "general.architecture")
    if architecture != "clip":
        raise ValueError(f"mmproj {path} is not a projector file: general.architecture is "
                         f"{architecture!r}, llama.cpp's projectors say 'clip'")  # fmt: skip
    name = _value(reader, "clip.projector_type")
    if name not in PROJECTORS:
        raise ValueError(f"mmproj {path}: clip.projector_type {name!r} is not supported "
                         f"(supported: {', '.join(PROJECTORS)})")  # fmt: skip
    projector = PROJECTORS[name]
    for key in sorted(reader.fields):
        if key.startswith("clip.") and key not in _COMMON_KEYS | projector.keys:
            raise ValueError(f"mmproj {path}: GGUF key {key!r} is not supported for a "
                             f"{name!r} projector")  # fmt: skip
    if _value(reader, "clip.has_audio_encoder", False):
        raise ValueError(f"mmproj {path}: clip.has_audio_encoder: audio is not supported")
    if not _value(reader, "clip.has_vision_encoder", False):
        raise ValueError(f"mmproj {path}: clip.has_vision_encoder is not set: no vision tower")
    # llama.cpp: use_gelu, else use_silu, else GELU-quick (which no tower here has).
    on = [key for key in ("clip.use_gelu", "clip.use_silu") if _value(reader, key, False)]
    if on != [projector.activation]:
        activation = _ACTIVATIONS[projector.activation]
        raise ValueError(f"mmproj {path}: a {name!r} tower's MLP must be {activation} "
                         f"({projector.activation} alone)")  # fmt: skip
    return projector


def _full_attention(depth: int, pattern: int) -> tuple[int, ...]:
    """llama.cpp's n_wa_pattern: block i sees the whole image iff (i + 1) % pattern == 0; 0 or
    no key: every block does."""
    return tuple(i for i in range(depth) if not pattern or (i + 1) % pattern == 0)


def read_mmproj(path: Path) -> Mmproj:
    """The projector's metadata; ValueError naming the file and the key it cannot take."""
    reader = gguf_reader(path)
    projector = _check_file(reader, path)

    def need(key: str) -> int:
        return int(_required(reader, path, f"clip.vision.{key}"))

    vision = VisionConfig(
        depth=need("block_count"),
        hidden_size=need("embedding_length"),
        num_heads=need("attention.head_count"),
        intermediate_size=need("feed_forward_length"),
        out_hidden_size=need("projection_dim"),
        patch_size=need("patch_size"),
        layer_norm_eps=_decimal(_value(reader, "clip.vision.attention.layer_norm_epsilon", _EPS)),
    )
    mmproj = Mmproj(
        path=path, projector=projector, vision=vision,
        image_mean=tuple(float(x) for x in _required(reader, path, "clip.vision.image_mean")),
        image_std=tuple(float(x) for x in _required(reader, path, "clip.vision.image_std")),
    )  # fmt: skip
    if projector.family == "gemma3":
        return _gemma3(reader, mmproj, need("image_size"))
    return _qwen2_5_vl(reader, mmproj, need("n_wa_pattern"))


def _qwen2_5_vl(reader: GGUFReader, mmproj: Mmproj, pattern: int) -> Mmproj:
    """Qwen2.5-VL's windows, merger and image bounds."""
    path, vision = mmproj.path, mmproj.vision
    if not math.isclose(vision.layer_norm_eps, _EPS, rel_tol=1e-6):
        raise ValueError(f"mmproj {path}: clip.vision.attention.layer_norm_epsilon "
                         f"{vision.layer_norm_eps} is not supported (the tower's norms use "
                         f"{_EPS})")  # fmt: skip
    names = {t.name for t in reader.tensors}
    if not set(_PATCH) <= names:
        raise ValueError(f"mmproj {path}: the patch embedding needs both {' and '.join(_PATCH)}")
    merge = int(_value(reader, "clip.vision.spatial_merge_size", DEFAULT_MERGE))
    vision = replace(
        vision, temporal_patch_size=len(_PATCH), spatial_merge_size=merge,
        window_size=int(_value(reader, "clip.vision.window_size", DEFAULT_WINDOW)),
        fullatt_block_indexes=_full_attention(vision.depth, pattern),
    )  # fmt: skip
    area = (vision.patch_size * merge) ** 2  # the pixels of one token
    return replace(
        mmproj, vision=vision,
        min_pixels=int(_value(reader, "clip.vision.image_min_pixels", MIN_TOKENS * area)),
        max_pixels=int(_value(reader, "clip.vision.image_max_pixels", MAX_TOKENS * area)),
    )  # fmt: skip


def _gemma3(reader: GGUFReader, mmproj: Mmproj, image_size: int) -> Mmproj:
    """Gemma 3: one image size, its patch grid average-pooled pool x pool to tokens."""
    path, patch = mmproj.path, mmproj.vision.patch_size
    pool = int(_value(reader, "clip.vision.projector.scale_factor", GEMMA3_DEFAULT_POOL))
    side = image_size // patch
    if image_size % patch or pool <= 0 or side % pool:
        raise ValueError(f"mmproj {path}: clip.vision.image_size {image_size} in patches of "
                         f"{patch} does not pool {pool} x {pool} into tokens")  # fmt: skip
    vision = replace(
        mmproj.vision, spatial_merge_size=pool, hidden_act="gelu_tanh", image_size=image_size,
        tokens_per_image=(side // pool) ** 2,
    )  # fmt: skip
    return replace(mmproj, vision=vision)


def _token_id(lm: GGUFReader, lm_path: Path, token: str) -> int:
    field = lm.fields.get("tokenizer.ggml.tokens")
    tokens = field.contents() if field is not None else []
    if token not in tokens:
        raise ValueError(f"{lm_path}: the vocabulary has no {token} token for images")
    return int(tokens.index(token))


def image_token_id(lm: GGUFReader, lm_path: Path, projector: Projector) -> int:
    """The id of the token the processor expands into an image's tokens, from the LM's
    vocabulary (Gemma 3's chat template writes <start_of_image>, which must be there too)."""
    if projector.family == "gemma3":
        for token in (gemma3.BOI, gemma3.EOI):
            _token_id(lm, lm_path, token)
    return _token_id(lm, lm_path, projector.image_token)


def with_vision(arch: ArchConfig, lm: GGUFReader, lm_path: Path, mmproj: Mmproj) -> ArchConfig:
    """The language model's shape joined with the projector's tower: refused, by name, where
    the two do not go together."""
    architecture = _value(lm, "general.architecture")
    wanted = mmproj.projector.language_model
    if architecture != wanted:
        raise ValueError(
            f"mmproj {mmproj.path} is a vision projector for a {wanted!r} language model; "
            f"{lm_path} is a text-only {architecture!r} model"
        )
    if mmproj.vision.out_hidden_size != arch.hidden_size:
        raise ValueError(
            f"mmproj {mmproj.path}: clip.vision.projection_dim {mmproj.vision.out_hidden_size} "
            f"differs from {lm_path}'s hidden size {arch.hidden_size}: not the same model"
        )
    token = image_token_id(lm, lm_path, mmproj.projector)
    vision = replace(mmproj.vision, image_token_id=token)
    return replace(arch, architecture=mmproj.family, vision=vision)


def mmproj_image_processor(mmproj: Mmproj, image_token_id: int) -> ImageProcessor:
    """The family's processor on what the projector says (no preprocessor_config.json:
    llama.cpp's file holds what it needs). Qwen2-VL's: patch, merge, pixel bounds, mean and
    std. Gemma 3's: the image size, patch, tokens, mean and std, bilinear resizing and the
    chat template's tokens (Gemma 3's; as transformers' processor, which stretches an image to
    the square where llama.cpp pads it)."""
    vision = mmproj.vision
    if mmproj.family == "gemma3":
        return gemma3.Gemma3ImageProcessor(
            image_token_id, image_size=vision.image_size, patch_size=vision.patch_size,
            num_tokens=vision.tokens_per_image, mean=mmproj.image_mean, std=mmproj.image_std,
        )  # fmt: skip
    return Qwen2VLImageProcessor(
        image_token_id, patch_size=vision.patch_size,
        temporal_patch_size=vision.temporal_patch_size, merge_size=vision.spatial_merge_size,
        min_pixels=mmproj.min_pixels, max_pixels=mmproj.max_pixels,
        mean=mmproj.image_mean, std=mmproj.image_std,
    )  # fmt: skip


def _gemma3_names(reader: GGUFReader, mmproj: Mmproj) -> dict[str, str]:
    """The checkpoint's name of each Gemma 3 projector tensor. Older files name the MLP's two
    layers the other way round (fc1 as ffn_down); as llama.cpp does, they are told by shape:
    an ffn_down that takes the tower's width (not its MLP's) is fc1."""
    width = mmproj.vision.hidden_size
    swapped = mmproj.vision.intermediate_size != width and any(
        t.name.endswith(".ffn_down.weight") and int(t.shape[0]) == width for t in reader.tensors
    )
    names = {}
    for tensor in reader.tensors:
        name = tensor.name
        if name in _GEMMA3_TOP_NAMES:
            names[name] = _GEMMA3_TOP_NAMES[name]
            continue
        match = _BLOCK_RE.fullmatch(name)
        if match is None or match.group(2) not in _SIGLIP_BLOCK_PARTS:
            raise ValueError(f"mmproj {mmproj.path}: tensor {name!r} is not part of a "
                             "supported tower")  # fmt: skip
        layer, part, kind = match.groups()
        if swapped and part in _MLP_SWAP:
            part = _MLP_SWAP[part]
        names[name] = f"{_SIGLIP}encoder.layers.{layer}.{_SIGLIP_BLOCK_PARTS[part]}.{kind}"
    return names


def _hf_name(name: str, path: Path) -> str:
    """The Qwen2.5-VL tower's parameter (under `visual.`) a projector tensor is, or a part of
    (qkv)."""
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
    if mmproj.family == "gemma3":
        return len(set(_gemma3_names(reader, mmproj).values()))
    names = {_hf_name(t.name, mmproj.path) for t in reader.tensors if t.name not in _PATCH}
    return len(names) + 1  # + the patch embedding


def iter_mmproj_weights(mmproj: Mmproj) -> Iterator[tuple[str, torch.Tensor]]:
    """(transformers' name, float32 tensor) for every weight of the tower and projector."""
    if mmproj.family == "gemma3":
        reader = gguf_reader(mmproj.path)
        names = _gemma3_names(reader, mmproj)
        for tensor in reader.tensors:
            data = np.require(to_numpy(tensor), requirements=["C", "W"])
            yield names[tensor.name], torch.from_numpy(data)
        return
    yield from _iter_qwen2_5_vl_weights(mmproj)


def _iter_qwen2_5_vl_weights(mmproj: Mmproj) -> Iterator[tuple[str, torch.Tensor]]:
    """q, k and v joined in that order into qkv, the patch embedding's frames stacked along
    time, as the converter split them."""
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
