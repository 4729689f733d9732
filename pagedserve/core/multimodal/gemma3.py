"""Gemma 3's image processor (transformers' Gemma3ImageProcessor and Gemma3Processor, PIL
backend, pan-and-scan off): every image is resized to the tower's square (bilinear), scaled to
[0, 1] and normalized per channel (mean and std 0.5), then cut into patch_size patches in
row-major order, each channel-major (the patch embedding's weight order). Every image takes
mm_tokens_per_image tokens.

In the prompt the chat template writes <start_of_image> per image; the processor replaces it
with a blank line, <start_of_image>, the image's tokens, <end_of_image> and a blank line, in
the text, before tokenizing (the blank lines may merge with the text around them into other
tokens, so the ids come from the expanded text). Here the expanded text carries one image
token per image, which `expand_image_tokens` then turns into the image's placeholder ids.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pagedserve.core.multimodal.inputs import ImageFeatures

if TYPE_CHECKING:  # PIL loads with the first image (the server's decode), not with the model
    from PIL import Image

BOI, EOI, IMAGE = "<start_of_image>", "<end_of_image>", "<image_soft_token>"
_RESAMPLE = {0: "NEAREST", 1: "LANCZOS", 2: "BILINEAR", 3: "BICUBIC"}
"""transformers' PILImageResampling values (preprocessor_config.json's resample), which are
PIL's Image.Resampling values: resize takes the int."""


class Gemma3ImageProcessor:
    whole_images = True  # an image's tokens attend to each other both ways

    def __init__(
        self,
        image_token_id: int,
        *,
        image_size: int,
        patch_size: int,
        num_tokens: int,
        mean: tuple[float, ...] = (0.5, 0.5, 0.5),
        std: tuple[float, ...] = (0.5, 0.5, 0.5),
        rescale_factor: float = 1 / 255,
        resample: int = 2,  # BILINEAR
        tokens: tuple[str, str, str] = (BOI, EOI, IMAGE),
    ) -> None:
        self.image_token_id = image_token_id
        self.image_size = image_size
        self.patch_size = patch_size
        self.num_tokens = num_tokens
        self.mean = np.asarray(mean, dtype=np.float32).reshape(3, 1, 1)
        self.std = np.asarray(std, dtype=np.float32).reshape(3, 1, 1)
        self.rescale_factor = np.float32(rescale_factor)
        self.resample = resample
        self.boi, self.eoi, self.image_token = tokens

    @classmethod
    def from_folder(cls, folder: Path, config: dict[str, Any]) -> Gemma3ImageProcessor:
        """From config.json (image_token_index, mm_tokens_per_image, the tower's sizes),
        preprocessor_config.json (size, mean, std, resample; pan-and-scan and the do_* steps
        turned off are refused by name) and tokenizer_config.json (the tokens' text)."""
        pre = _read(folder / "preprocessor_config.json")
        _refuse_options(pre)
        vision = config.get("vision_config") or {}
        size = pre.get("size") or {}
        image_size = int(size.get("height") or vision.get("image_size") or 224)
        if size.get("width", image_size) != image_size:
            raise ValueError("preprocessor_config.json: size must be square for Gemma 3")
        return cls(
            int(config.get("image_token_index") or config.get("image_token_id") or 262_144),
            image_size=image_size,
            patch_size=int(vision.get("patch_size") or 16),
            num_tokens=int(config.get("mm_tokens_per_image") or 256),
            mean=tuple(pre.get("image_mean") or (0.5, 0.5, 0.5)),
            std=tuple(pre.get("image_std") or (0.5, 0.5, 0.5)),
            rescale_factor=float(pre.get("rescale_factor") or 1 / 255),
            resample=_resample(pre.get("resample", 2)),
            tokens=_token_texts(folder),
        )

    def expand_prompt(self, text: str) -> str:
        """Each <start_of_image> the template wrote -> the processor's image sequence, with
        one image token (expand_image_tokens makes it the image's tokens)."""
        return text.replace(self.boi, f"\n\n{self.boi}{self.image_token}{self.eoi}\n\n")

    def preprocess(self, image: Image.Image, image_hash: bytes) -> ImageFeatures:
        side = self.image_size
        rgb = image.convert("RGB")
        if rgb.size != (side, side):
            rgb = rgb.resize((side, side), self.resample)
        pixels = np.asarray(rgb, dtype=np.float32).transpose(2, 0, 1) * self.rescale_factor
        pixels = (pixels - self.mean) / self.std
        p = self.patch_size
        grid = side // p
        x = pixels.reshape(3, grid, p, grid, p).transpose(1, 3, 0, 2, 4)  # [gh, gw, C, p, p]
        patches = np.ascontiguousarray(x.reshape(grid * grid, 3 * p * p))
        return ImageFeatures(patches, (1, grid, grid), self.num_tokens, image_hash)


def _resample(value: Any) -> int:
    if int(value) not in _RESAMPLE:
        raise ValueError(f"preprocessor_config.json: resample {value!r} is not one of {_RESAMPLE}")
    return int(value)


def _read(path: Path) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {}
    return found


def _refuse_options(pre: dict[str, Any]) -> None:
    """What transformers' processor would do that this one does not, by name."""
    if pre.get("do_pan_and_scan"):
        raise ValueError(
            "preprocessor_config.json: do_pan_and_scan (Gemma 3's crops of wide images) is "
            "not supported; set it to false"
        )
    for step in ("do_resize", "do_rescale", "do_normalize", "do_convert_rgb"):
        if pre.get(step) is False:
            raise ValueError(f"preprocessor_config.json: {step} false is not supported")


def _token_texts(folder: Path) -> tuple[str, str, str]:
    """<start_of_image>, <end_of_image> and the image token as the tokenizer names them
    (tokenizer_config.json's boi_token / eoi_token / image_token, top level or under
    extra_special_tokens), Gemma 3's by default."""
    config = _read(folder / "tokenizer_config.json")
    extra = config.get("extra_special_tokens")
    named = {**config, **(extra if isinstance(extra, dict) else {})}
    found = [named.get(key) for key in ("boi_token", "eoi_token", "image_token")]
    texts = [f if isinstance(f, str) else d for f, d in zip(found, (BOI, EOI, IMAGE), strict=True)]
    return texts[0], texts[1], texts[2]
