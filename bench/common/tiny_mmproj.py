"""llama.cpp's two files of a vision-language model, written from a tiny Qwen2.5-VL or Gemma 3
folder.

write_gguf_qwen2_5_vl: the language model (`qwen2vl` GGUF) and the projector (`clip` GGUF, what
convert_hf_to_gguf.py writes with --mmproj) from a folder of bench/common/tiny_vlm.py;
write_gguf_gemma3_vl: the same for Gemma 3 (a `gemma3` GGUF and a `gemma3` projector) from a
folder of bench/common/tiny_gemma3_vl.py. Each writes the keys, values, tensor names and types
llama.cpp's converter writes (f32, or f16 for every weight of two dimensions or more, but what
the converter keeps apart: Gemma 3's patch and position embeddings stay f32 and its input
projection is f16 in either; tests/core/multimodal/test_mmproj_llama_cpp.py holds the files
equal where the converter is unpacked). Q8_0: the language model's weights in Q8_0 blocks, the
projector in f32 (a quantized model beside its tower). `overrides` replaces or adds projector
keys, for the tests of what the loader refuses.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from safetensors.numpy import load_file
from tokenizers import Tokenizer

_TOP = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
_LAYER = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}  # fmt: skip
_BLOCK = {
    "attn.proj": "attn_out", "norm1": "ln1", "norm2": "ln2", "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}  # fmt: skip
_MERGER = {"merger.ln_q": "v.post_ln", "merger.mlp.0": "mm.0", "merger.mlp.2": "mm.2"}
PROJECTOR_TYPE = "qwen2.5vl_merger"
# Gemma 3: its language model's norms (and q / k norms) beyond Llama's, its SigLIP tower's.
_GEMMA3_LAYER = _LAYER | {
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm",
    "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
}  # fmt: skip
_SIGLIP_TOP = {
    "embeddings.patch_embedding": "v.patch_embd", "embeddings.position_embedding": "v.position_embd",
    "post_layernorm": "v.post_ln",
}  # fmt: skip
_SIGLIP_BLOCK = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.out_proj": "attn_out", "layer_norm1": "ln1", "layer_norm2": "ln2",
    "mlp.fc1": "ffn_up", "mlp.fc2": "ffn_down",
}  # fmt: skip
# The converter's Gemma 3 projector: pooled to 4 x 4 unless it says otherwise (llama.cpp's default).
GEMMA3_DEFAULT_SCALE = 4
_F32 = gguf.GGMLQuantizationType.F32


def write_gguf_qwen2_5_vl(
    folder: Path,
    lm_path: Path,
    mmproj_path: Path,
    *,
    qtype: str = "F32",
    overrides: dict[str, Any] | None = None,
) -> None:
    """Both files from the folder's config.json, tokenizer and model.safetensors."""
    _write_pair(
        folder, (lm_path, mmproj_path), qtype, overrides, _write_language_model, _write_mmproj
    )


def write_gguf_gemma3_vl(
    folder: Path,
    lm_path: Path,
    mmproj_path: Path,
    *,
    qtype: str = "F32",
    overrides: dict[str, Any] | None = None,
    swapped_mlp: bool = False,
) -> None:
    """Both files of a Gemma 3 folder (its tower under the hub's vision_tower.vision_model.
    names or transformers 5's vision_tower.). swapped_mlp: the tower's fc1 named ffn_down and
    fc2 ffn_up, as older projector files have them (llama.cpp tells them by shape)."""
    mmproj = functools.partial(_write_gemma3_mmproj, swapped_mlp=swapped_mlp)
    _write_pair(folder, (lm_path, mmproj_path), qtype, overrides, _write_gemma3_language_model,
                mmproj)  # fmt: skip


def _write_pair(
    folder: Path,
    paths: tuple[Path, Path],
    qtype: str,
    overrides: dict[str, Any] | None,
    write_language_model: Callable[..., None],
    write_mmproj: Callable[..., None],
) -> None:
    config = json.loads((folder / "config.json").read_text())
    weights = load_file(str(folder / "model.safetensors"))
    quant = gguf.GGMLQuantizationType[qtype]
    write_language_model(folder, config, weights, paths[0], quant)
    tower = gguf.GGMLQuantizationType.F32 if qtype == "Q8_0" else quant
    write_mmproj(folder, config, weights, paths[1], tower, overrides or {})


def _add(writer: gguf.GGUFWriter, name: str, data: np.ndarray, quant: Any) -> None:
    """Weights of two dimensions or more in `quant` (F32, F16 or Q8_0), the rest in float32."""
    data = np.ascontiguousarray(data, dtype=np.float32)
    if data.ndim >= 2 and quant == gguf.GGMLQuantizationType.F16:
        writer.add_tensor(name, data.astype(np.float16))
    elif data.ndim >= 2 and quant == gguf.GGMLQuantizationType.Q8_0:
        writer.add_tensor(name, gguf.quants.quantize(data, quant), raw_dtype=quant)
    else:
        writer.add_tensor(name, data)


def _finish(writer: gguf.GGUFWriter) -> None:
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _write_language_model(
    folder: Path, config: dict[str, Any], weights: dict[str, np.ndarray], path: Path, quant: Any
) -> None:
    text = config["text_config"]
    writer = _language_model_writer(path, "qwen2vl", text, quant)
    rope = text["rope_parameters"]
    writer.add_rope_dimension_sections([*rope["mrope_section"], 0])
    writer.add_rope_freq_base(rope["rope_theta"])
    _add_vocabulary(writer, folder, text)
    _add_language_model_tensors(writer, weights, quant, _LAYER)
    _finish(writer)


def _write_gemma3_language_model(
    folder: Path, config: dict[str, Any], weights: dict[str, np.ndarray], path: Path, quant: Any
) -> None:
    """The converter's Gemma3Model: norms stored as 1 + weight, the head tied (left out)."""
    text = config["text_config"]
    writer = _language_model_writer(path, "gemma3", text, quant)
    rope = text["rope_parameters"]
    writer.add_rope_freq_base(rope["full_attention"]["rope_theta"])
    writer.add_rope_freq_base_swa(rope["sliding_attention"]["rope_theta"])
    writer.add_key_length(text["head_dim"])
    writer.add_value_length(text["head_dim"])
    writer.add_sliding_window(text["sliding_window"])
    _add_vocabulary(writer, folder, text)
    _add_language_model_tensors(writer, weights, quant, _GEMMA3_LAYER, norm_shift=1.0)
    _finish(writer)


def _language_model_writer(
    path: Path, architecture: str, text: dict[str, Any], quant: Any
) -> gguf.GGUFWriter:
    """A language model's file with the shape keys every architecture has."""
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_type("model")
    writer.add_block_count(text["num_hidden_layers"])
    writer.add_context_length(text["max_position_embeddings"])
    writer.add_embedding_length(text["hidden_size"])
    writer.add_feed_forward_length(text["intermediate_size"])
    writer.add_head_count(text["num_attention_heads"])
    writer.add_head_count_kv(text["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(text["rms_norm_eps"])
    writer.add_file_type(int(quant))
    return writer


def _add_language_model_tensors(
    writer: gguf.GGUFWriter,
    weights: dict[str, np.ndarray],
    quant: Any,
    layer_names: dict[str, str],
    norm_shift: float = 0.0,
) -> None:
    """The language model's weights (model.* and lm_head, under language_model. or not);
    norm_shift is added to the norms (Gemma's 1 + weight, as the converter adds it)."""
    for name, data in weights.items():
        if name.startswith(("visual.", "vision_tower.", "multi_modal_projector.")):
            continue
        stem, kind = name.removeprefix("language_model.").rsplit(".", 1)
        if norm_shift and stem.endswith("norm"):
            data = data + np.float32(norm_shift)
        if stem in _TOP:
            _add(writer, f"{_TOP[stem]}.{kind}", data, quant)
            continue
        _, _, layer, rest = stem.split(".", 3)  # model.layers.{i}.{rest}
        _add(writer, f"blk.{layer}.{layer_names[rest]}.{kind}", data, quant)


def _write_gemma3_mmproj(
    folder: Path,
    config: dict[str, Any],
    weights: dict[str, np.ndarray],
    path: Path,
    quant: Any,
    overrides: dict[str, Any],
    swapped_mlp: bool = False,
) -> None:
    vision = config["vision_config"]
    processor = json.loads((folder / "processor_config.json").read_text())
    per_side = math.isqrt(int(processor.get("image_seq_length", 256)))
    scale = vision["image_size"] // vision["patch_size"] // per_side
    keys = _clip_keys(folder, config, vision["image_size"]) | {
        "clip.projector_type": "gemma3",
        "clip.vision.attention.layer_norm_epsilon": float(vision.get("layer_norm_eps", 1e-6)),
        "clip.use_gelu": True,
    }
    if scale > 0 and scale != GEMMA3_DEFAULT_SCALE:
        keys["clip.vision.projector.scale_factor"] = scale
    writer = _mmproj_writer(path, quant, keys | overrides)
    for name, data in weights.items():
        if name.startswith("multi_modal_projector."):
            _add_gemma3_projector_tensor(writer, name, data)
        elif name.startswith("vision_tower."):
            tower = name.removeprefix("vision_tower.").removeprefix("vision_model.")
            _add_siglip_tensor(writer, tower, data, quant, swapped_mlp)
    _finish(writer)


def _add_gemma3_projector_tensor(writer: gguf.GGUFWriter, name: str, data: np.ndarray) -> None:
    """The input projection in f16 whatever the type (the converter's choice, llama.cpp
    issue 13025), the soft embedding norm as 1 + weight."""
    if name.endswith("mm_input_projection_weight"):
        _add(writer, "mm.input_projection.weight", data, gguf.GGMLQuantizationType.F16)
    else:
        _add(writer, "mm.soft_emb_norm.weight", data + np.float32(1), _F32)


def _add_siglip_tensor(
    writer: gguf.GGUFWriter, name: str, data: np.ndarray, quant: Any, swapped_mlp: bool
) -> None:
    """One SigLIP weight; the embeddings (patch and position) stay f32."""
    stem, kind = name.rsplit(".", 1)
    if stem in _SIGLIP_TOP:
        embeddings = stem.startswith("embeddings.")
        _add(writer, f"{_SIGLIP_TOP[stem]}.{kind}", data, _F32 if embeddings else quant)
        return
    _, _, layer, rest = stem.split(".", 3)  # encoder.layers.{i}.{rest}
    part = _SIGLIP_BLOCK[rest]
    if swapped_mlp and part in ("ffn_up", "ffn_down"):
        part = "ffn_down" if part == "ffn_up" else "ffn_up"
    _add(writer, f"v.blk.{layer}.{part}.{kind}", data, quant)


def _add_vocabulary(writer: gguf.GGUFWriter, folder: Path, text: dict[str, Any]) -> None:
    """The converter's gpt2 vocabulary: tokens, types (added special tokens are control),
    merges, the special ids of config.json, the chat template."""
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    special = {t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special}
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    writer.add_tokenizer_model("gpt2")
    # GPT-2's split, by llama.cpp's name (its converter recognizes real models' splits only).
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list([tok for tok, _ in vocab])
    writer.add_token_types([3 if tok in special else 1 for tok, _ in vocab])
    merges = json.loads(tokenizer.to_str())["model"]["merges"]
    writer.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in merges])
    writer.add_eos_token_id(text["eos_token_id"])
    tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
    writer.add_pad_token_id(tokenizer.token_to_id(tokenizer_config["pad_token"]))
    writer.add_bos_token_id(text["bos_token_id"])
    writer.add_add_bos_token(bool(tokenizer_config.get("add_bos_token", False)))
    writer.add_chat_template(tokenizer_config["chat_template"])


def _write_mmproj(
    folder: Path,
    config: dict[str, Any],
    weights: dict[str, np.ndarray],
    path: Path,
    quant: Any,
    overrides: dict[str, Any],
) -> None:
    vision = config["vision_config"]
    keys = _clip_keys(folder, config, 560) | {  # 560: the converter's default for Qwen2-VL
        "clip.projector_type": PROJECTOR_TYPE,
        "clip.use_silu": True,
        "clip.vision.n_wa_pattern": vision["fullatt_block_indexes"][0] + 1,
        "clip.vision.attention.layer_norm_epsilon": 1e-6,
    }
    writer = _mmproj_writer(path, quant, keys | overrides)
    for name, data in weights.items():
        if name.startswith("visual."):
            _add_tower_tensor(writer, name.removeprefix("visual."), data, quant)
    _finish(writer)


def _clip_keys(folder: Path, config: dict[str, Any], image_size: int) -> dict[str, Any]:
    """The keys every vision projector has: the tower's shape (under either family's names)
    and the preprocessor's mean and std."""
    vision = config["vision_config"]
    pre = json.loads((folder / "preprocessor_config.json").read_text())
    return {
        "clip.has_vision_encoder": True,
        "clip.vision.projection_dim": config["text_config"]["hidden_size"],
        "clip.vision.image_size": image_size,
        "clip.vision.patch_size": vision["patch_size"],
        "clip.vision.embedding_length": vision["hidden_size"],
        "clip.vision.feed_forward_length": vision["intermediate_size"],
        "clip.vision.block_count": vision.get("num_hidden_layers") or vision["depth"],
        "clip.vision.attention.head_count": vision.get("num_attention_heads")
        or vision["num_heads"],
        "clip.vision.image_mean": [float(x) for x in pre["image_mean"]],
        "clip.vision.image_std": [float(x) for x in pre["image_std"]],
    }


def _mmproj_writer(path: Path, quant: Any, keys: dict[str, Any]) -> gguf.GGUFWriter:
    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_type("mmproj")
    writer.add_file_type(int(quant))
    for key, value in keys.items():
        _add_key(writer, key, value)
    return writer


def _add_key(writer: gguf.GGUFWriter, key: str, value: Any) -> None:
    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        writer.add_uint32(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, str):
        writer.add_string(key, value)
    else:
        writer.add_array(key, value)


def _add_tower_tensor(writer: gguf.GGUFWriter, name: str, data: np.ndarray, quant: Any) -> None:
    """One HF tower weight as the converter splits it: q / k / v apart, the Conv3d's two
    frames as two patch embeddings."""
    if name == "patch_embed.proj.weight":  # [hidden, channels, 2, patch, patch]
        _add(writer, "v.patch_embd.weight", data[:, :, 0], quant)
        _add(writer, "v.patch_embd.weight.1", data[:, :, 1], quant)
        return
    stem, kind = name.rsplit(".", 1)
    if stem in _MERGER:
        _add(writer, f"{_MERGER[stem]}.{kind}", data, quant)
        return
    _, layer, rest = stem.split(".", 2)  # blocks.{i}.{rest}
    if rest == "attn.qkv":
        for part, piece in zip(("attn_q", "attn_k", "attn_v"), np.split(data, 3), strict=True):
            _add(writer, f"v.blk.{layer}.{part}.{kind}", piece, quant)
        return
    _add(writer, f"v.blk.{layer}.{_BLOCK[rest]}.{kind}", data, quant)
