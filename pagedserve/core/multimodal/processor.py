"""Image processors: a decoded image -> `ImageFeatures` (pixels in the tower's patch order and
the number of prompt tokens it takes). numpy + Pillow, no torch.

Qwen2-VL / Qwen2.5-VL (transformers' Qwen2VLImageProcessor, PIL backend): the image is resized
(bicubic) so both sides are multiples of patch_size * merge_size and its area lies in
[min_pixels, max_pixels] (`smart_resize`), scaled to [0, 1], normalized per channel, repeated
temporal_patch_size times along time and cut into patches ordered merge group by merge group.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from pagedserve.core.multimodal.gemma3 import Gemma3ImageProcessor
from pagedserve.core.multimodal.inputs import ImageFeatures

if TYPE_CHECKING:  # PIL loads with the first image (the server's decode), not with the model
    from PIL import Image

_BICUBIC = 3
"""PIL's Image.Resampling.BICUBIC (an IntEnum: resize takes the int)."""
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


class ImageProcessor(Protocol):
    """What the server asks of a model that takes images."""

    image_token_id: int
    """The token the chat template writes once per image (expanded to the image's tokens)."""
    whole_images: bool
    """An image's tokens attend to each other both ways (Gemma 3): the scheduler computes
    each image's tokens in one chunk."""

    def expand_prompt(self, text: str) -> str:
        """The rendered prompt as the model's processor rewrites it before tokenizing (each
        image's text around its one image token; Qwen2-VL's keeps it)."""

    def preprocess(self, image: Image.Image, image_hash: bytes) -> ImageFeatures:
        """An RGB image -> its features; ValueError for an image the model cannot take."""


def smart_resize(
    height: int, width: int, factor: int, min_pixels: int, max_pixels: int
) -> tuple[int, int]:
    """Both sides multiples of `factor`, the area within [min_pixels, max_pixels], the aspect
    ratio kept as closely as that allows (Qwen2-VL's rule)."""
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"aspect ratio {width}x{height} is over 200: too thin for the model")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


class Qwen2VLImageProcessor:
    whole_images = False

    def __init__(
        self,
        image_token_id: int,
        *,
        patch_size: int = 14,
        temporal_patch_size: int = 2,
        merge_size: int = 2,
        min_pixels: int = 56 * 56,
        max_pixels: int = 28 * 28 * 1280,
        mean: tuple[float, ...] = CLIP_MEAN,
        std: tuple[float, ...] = CLIP_STD,
    ) -> None:
        self.image_token_id = image_token_id
        self.patch_size = patch_size
        self.temporal_patch_size = temporal_patch_size
        self.merge_size = merge_size
        self.min_pixels = min_pixels
        self.max_pixels = max_pixels
        self.mean = np.asarray(mean, dtype=np.float32).reshape(3, 1, 1)
        self.std = np.asarray(std, dtype=np.float32).reshape(3, 1, 1)

    @classmethod
    def from_folder(cls, folder: Path, config: dict[str, Any]) -> Qwen2VLImageProcessor:
        """From config.json (image_token_id, the vision config's patch sizes) and
        preprocessor_config.json (pixels bounds, mean, std), each optional."""
        path = folder / "preprocessor_config.json"
        pre: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {}
        vision = config.get("vision_config", {})
        size = pre.get("size") or {}
        return cls(
            int(config["image_token_id"]),
            patch_size=int(pre.get("patch_size", vision.get("patch_size", 14))),
            temporal_patch_size=int(
                pre.get("temporal_patch_size", vision.get("temporal_patch_size", 2))
            ),
            merge_size=int(pre.get("merge_size", vision.get("spatial_merge_size", 2))),
            min_pixels=int(pre.get("min_pixels", size.get("shortest_edge", 56 * 56))),
            max_pixels=int(pre.get("max_pixels", size.get("longest_edge", 28 * 28 * 1280))),
            mean=tuple(pre.get("image_mean", CLIP_MEAN)),
            std=tuple(pre.get("image_std", CLIP_STD)),
        )

    def expand_prompt(self, text: str) -> str:
        return text

    def preprocess(self, image: Image.Image, image_hash: bytes) -> ImageFeatures:
        factor = self.patch_size * self.merge_size
        height, width = smart_resize(
            image.height, image.width, factor, self.min_pixels, self.max_pixels
        )
        rgb = image.convert("RGB")
        if (width, height) != rgb.size:
            rgb = rgb.resize((width, height), _BICUBIC)
        pixels = np.asarray(rgb, dtype=np.float32).transpose(2, 0, 1) * np.float32(1 / 255)
        pixels = (pixels - self.mean) / self.std
        patches, grid_h, grid_w = self._patchify(pixels)
        num_tokens = grid_h * grid_w // (self.merge_size**2)
        return ImageFeatures(patches, (1, grid_h, grid_w), num_tokens, image_hash)

    def _patchify(self, pixels: np.ndarray) -> tuple[np.ndarray, int, int]:
        """[3, H, W] -> [grid_h * grid_w, 3 * temporal * patch * patch], merge groups first."""
        p, m, t = self.patch_size, self.merge_size, self.temporal_patch_size
        channels, height, width = pixels.shape
        grid_h, grid_w = height // p, width // p
        x = pixels.reshape(channels, grid_h // m, m, p, grid_w // m, m, p)
        x = x.transpose(1, 4, 2, 5, 0, 3, 6)  # [gh/m, gw/m, m, m, C, p, p]
        x = np.broadcast_to(x[:, :, :, :, :, None], (*x.shape[:5], t, p, p))
        flat = np.ascontiguousarray(x.reshape(grid_h * grid_w, channels * t * p * p))
        return flat, grid_h, grid_w


def load_image_processor(folder: Path) -> ImageProcessor:
    """The processor of a model folder whose config.json names a family that takes images."""
    with open(folder / "config.json", encoding="utf-8") as f:
        config = json.load(f)
    model_type = config.get("model_type")
    if model_type in ("qwen2_vl", "qwen2_5_vl"):
        return Qwen2VLImageProcessor.from_folder(folder, config)
    if model_type == "gemma3":
        return Gemma3ImageProcessor.from_folder(folder, config)
    raise ValueError(f"model_type {model_type!r} has a vision tower but no image processor here")
