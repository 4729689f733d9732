"""A tiny random Qwen2.5-VL written as an HF folder, for tests and benchmarks.

write_tiny_qwen2_5_vl: config.json + model.safetensors through transformers'
Qwen2_5_VLForConditionalGeneration (a 2-layer language model, a 2-block vision tower whose
second block attends to the whole image and first to 56-pixel windows), a tiny byte-level BPE
with Qwen2-VL's special tokens, a chat template that writes
<|vision_start|><|image_pad|><|vision_end|> for each image part, and preprocessor_config.json
with small pixel bounds (images of a few hundred patches at most).
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from bench.common.tiny_models import randomize_
from bench.common.tiny_tokenizers import BPE_SPECIAL_TOKENS, TRAINING_CORPUS, train_tiny_bpe

VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
QWEN2_VL_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MIN_PIXELS = 56 * 56
MAX_PIXELS = 28 * 28 * 64


def write_tiny_qwen2_5_vl(
    folder: Path,
    *,
    seed: int = 0,
    text_shape: dict[str, Any] | None = None,
    vision_shape: dict[str, Any] | None = None,
) -> torch.nn.Module:
    """Write the folder; returns the transformers model (fp32, eval) it holds. text_shape /
    vision_shape: config fields replacing the tiny ones (benchmarks use wider models)."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tiny_bpe(400, [*BPE_SPECIAL_TOKENS, *VISION_TOKENS], TRAINING_CORPUS)
    tokenizer.save(str(folder / "tokenizer.json"))
    ids = {t: tokenizer.token_to_id(t) for t in VISION_TOKENS}
    _write(folder / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>", "add_bos_token": False, "chat_template": QWEN2_VL_TEMPLATE,
    })  # fmt: skip
    _write(folder / "preprocessor_config.json", {
        "image_processor_type": "Qwen2VLImageProcessor", "min_pixels": MIN_PIXELS,
        "max_pixels": MAX_PIXELS, "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
    })  # fmt: skip
    text = dict(
        vocab_size=tokenizer.get_vocab_size(), hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=512, rms_norm_eps=1e-6, bos_token_id=0, eos_token_id=2,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
    ) | (text_shape or {})  # fmt: skip
    vision = dict(
        depth=2, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=64,
        patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=56,
        fullatt_block_indexes=[1],
    ) | (vision_shape or {})  # fmt: skip
    config = Qwen2_5_VLConfig(
        text_config=text, vision_config=vision, image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"], eos_token_id=2, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(config).float().eval()
    randomize_(model, seed)
    model.save_pretrained(folder, safe_serialization=True)
    return model


def _write(path: Path, value: dict[str, Any]) -> None:
    path.write_text(json.dumps(value, indent=1), encoding="utf-8")


def random_image(width: int, height: int, seed: int) -> Image.Image:
    """An RGB image of uniform random pixels (the tests' images: nothing a model could read)."""
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def random_png(seed: int, size: tuple[int, int]) -> bytes:
    """random_image's PNG file, size = (width, height)."""
    buf = io.BytesIO()
    random_image(*size, seed).save(buf, "PNG")
    return buf.getvalue()
