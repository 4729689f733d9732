"""A tiny random Gemma 3 with images written as an HF folder, for tests and benchmarks.

write_tiny_gemma3_vl: config.json + model.safetensors through transformers'
Gemma3ForConditionalGeneration (a 3-layer Gemma 3 language model whose first two layers slide
over 8 tokens, a 1-layer SigLIP over 56-pixel images of 14-pixel patches, its 4 x 4 grid pooled
to 4 tokens per image), a tiny byte-level BPE with Gemma 3's special tokens, a chat template
that writes <start_of_image> for each image part as Gemma 3's does, and the processor's files
(preprocessor_config.json, processor_config.json) so that transformers' AutoProcessor loads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.numpy import load_file, save_file

from bench.common.tiny_models import randomize_
from bench.common.tiny_tokenizers import TRAINING_CORPUS, train_tiny_bpe

SPECIAL_TOKENS = ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>",
                  "<start_of_image>", "<end_of_image>", "<image_soft_token>"]  # fmt: skip
GEMMA3_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<start_of_turn>"
    "{{ 'model' if message['role'] == 'assistant' else message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] | trim }}"
    "{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' %}<start_of_image>"
    "{% elif item['type'] == 'text' %}{{ item['text'] | trim }}{% endif %}{% endfor %}{% endif %}"
    "<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
IMAGE_SIZE = 56
TOKENS_PER_IMAGE = 4


def write_tiny_gemma3_vl(
    folder: Path, *, seed: int = 0, llama_cpp: bool = False
) -> torch.nn.Module:
    """Write the folder; returns the transformers model (fp32, eval) it holds.

    llama_cpp: a model llama.cpp's two files say all of. Its language model has six layers,
    five sliding then a global one, and the attention scale head_dim ** -0.5: a gemma3 GGUF
    has no key for a layer pattern or a scale. Its input projection is exact in f16, which
    the converter writes it in whatever the type. The tower's weights are saved under
    vision_tower.vision_model., as in Google's checkpoints and as the converter reads them
    (transformers 5 saves them under vision_tower.)."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tiny_bpe(400, SPECIAL_TOKENS, TRAINING_CORPUS)
    tokenizer.save(str(folder / "tokenizer.json"))
    ids = {t: tokenizer.token_to_id(t) for t in SPECIAL_TOKENS}
    _write(folder / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<bos>",
        "eos_token": "<end_of_turn>", "pad_token": "<pad>", "add_bos_token": False,
        "chat_template": GEMMA3_TEMPLATE, "processor_class": "Gemma3Processor",
        "extra_special_tokens": {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>",
                                 "image_token": "<image_soft_token>"},
    })  # fmt: skip
    _write(folder / "preprocessor_config.json", {
        "image_processor_type": "Gemma3ImageProcessor", "processor_class": "Gemma3Processor",
        "size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE}, "resample": 2,
        "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
        "rescale_factor": 1 / 255, "do_pan_and_scan": None,
    })  # fmt: skip
    (folder / "chat_template.jinja").write_text(GEMMA3_TEMPLATE, encoding="utf-8")
    _write(folder / "processor_config.json", {
        "processor_class": "Gemma3Processor", "image_seq_length": TOKENS_PER_IMAGE,
    })  # fmt: skip
    text = _text_config(tokenizer.get_vocab_size()) | (_LLAMA_CPP_TEXT if llama_cpp else {})
    config = Gemma3Config(text_config=text,
                          vision_config=_VISION, mm_tokens_per_image=TOKENS_PER_IMAGE,
                          boi_token_index=ids["<start_of_image>"],
                          eoi_token_index=ids["<end_of_image>"],
                          image_token_index=ids["<image_soft_token>"])  # fmt: skip
    torch.manual_seed(seed)
    model = Gemma3ForConditionalGeneration(config).float().eval()
    randomize_(model, seed)
    if llama_cpp:
        with torch.no_grad():
            weight = model.model.multi_modal_projector.mm_input_projection_weight
            weight.copy_(weight.half().float())
    model.save_pretrained(folder, safe_serialization=True)
    if llama_cpp:
        _rename_tower(folder / "model.safetensors")
    return model


def _rename_tower(path: Path) -> None:
    weights = load_file(str(path))
    tower = "vision_tower."
    renamed = {tower + "vision_model." + k.removeprefix(tower) if k.startswith(tower) else k: v
               for k, v in weights.items()}  # fmt: skip
    save_file(renamed, str(path), metadata={"format": "pt"})


def _text_config(vocab_size: int) -> dict[str, Any]:
    return dict(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=24,
        sliding_window=8, max_position_embeddings=512, rms_norm_eps=1e-6,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        bos_token_id=2, eos_token_id=4, pad_token_id=0,
    )  # fmt: skip


_LLAMA_CPP_TEXT: dict[str, Any] = {
    "num_hidden_layers": 6, "query_pre_attn_scalar": 16,
    "layer_types": [*["sliding_attention"] * 5, "full_attention"],
}  # fmt: skip

_VISION = dict(
    hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
    image_size=IMAGE_SIZE, patch_size=14, vision_use_head=False,
)  # fmt: skip


def _write(path: Path, value: dict[str, Any]) -> None:
    path.write_text(json.dumps(value, indent=1), encoding="utf-8")
