"""Tiny Gemma 2, Gemma 3 (text) and Phi-3 models as GGUF files, written the way llama.cpp's
converter writes them (convert_hf_to_gguf.py's Gemma2Model, Gemma3Model, Phi3MiniModel):

- tensor names from the gguf package's own name map (the one the converter uses): Gemma's
  post_attention_norm / ffn_norm / post_ffw_norm, Phi-3's fused attn_qkv and ffn_up (gate rows
  first, as HF stores gate_up_proj);
- Gemma norms stored as 1 + weight (the converter adds the 1), Gemma 2's lm_head left out;
- the converter's keys only: Gemma 2's soft-caps and window, no rope base; Gemma 3's global and
  local rope bases and window; Phi-3's original context, rope dimensions, window (0: none) and,
  for longrope, its attention factor and the rope_factors_long / rope_factors_short tensors;
- a `llama` (SentencePiece) vocabulary from tests/tiny_tokenizers.py with each family's turn
  tokens as control tokens and its chat template.

What a GGUF cannot say, the source model must not use: llama.cpp's Gemma attention scale is
head_size ** -0.5 (so query_pre_attn_scalar = head_dim), and Gemma 3's layers follow
llama.cpp's fixed pattern (five sliding, then one global), so its tiny model has six layers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from sentencepiece import sentencepiece_model_pb2 as model_pb2

from bench.common.tiny_models import _add_tensor, add_gguf_shape, finish_gguf, make_hf_model
from bench.common.tiny_tokenizers import train_tiny_spm

GGUF_FAMILY_ARCH = {
    "gemma2": gguf.MODEL_ARCH.GEMMA2,
    "gemma3_text": gguf.MODEL_ARCH.GEMMA3,
    "phi3": gguf.MODEL_ARCH.PHI3,
}
# What each source model needs beyond tests/tiny_models.FAMILY_SHAPE (see above).
GGUF_FAMILY_SHAPE: dict[str, dict[str, Any]] = {
    "gemma2": {"query_pre_attn_scalar": 16, "attn_logit_softcapping": 50.0},
    "gemma3_text": {"query_pre_attn_scalar": 16, "num_hidden_layers": 6},
    "phi3": {},
}
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ '<start_of_turn>' + "
    "('model' if message['role'] == 'assistant' else message['role']) + '\\n' + "
    "message['content'] + '<end_of_turn>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)
PHI3_TEMPLATE = (
    "{% for message in messages %}{{ '<|' + message['role'] + '|>\\n' + message['content'] + "
    "'<|end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)
# family -> (turn tokens appended to the vocabulary as control tokens, template, add_bos)
_CHAT = {
    "gemma2": (["<start_of_turn>", "<end_of_turn>"], GEMMA_TEMPLATE, True),
    "gemma3_text": (["<start_of_turn>", "<end_of_turn>"], GEMMA_TEMPLATE, True),
    "phi3": (["<|user|>", "<|assistant|>", "<|end|>"], PHI3_TEMPLATE, False),
}
CONTROL = 3


def _vocab(family: str) -> tuple[list[str], list[float], list[int]]:
    proto = model_pb2.ModelProto()
    proto.ParseFromString(train_tiny_spm())
    turns = _CHAT[family][0]
    tokens = [p.piece for p in proto.pieces] + turns
    scores = [p.score for p in proto.pieces] + [-1000.0] * len(turns)  # the converter's score
    return tokens, scores, [p.type for p in proto.pieces] + [CONTROL] * len(turns)


def _add_vocab(writer: gguf.GGUFWriter, family: str) -> None:
    tokens, scores, types = _vocab(family)
    turns, template, add_bos = _CHAT[family]
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_eot_token_id(tokens.index(turns[-1]))  # <end_of_turn> / <|end|>
    writer.add_add_bos_token(add_bos)
    writer.add_add_eos_token(False)
    if family != "phi3":
        writer.add_add_space_prefix(False)  # Gemma's tokenizer has no dummy prefix
    writer.add_chat_template(template)


def _gemma_keys(writer: gguf.GGUFWriter, cfg: Any, family: str) -> list[tuple[str, np.ndarray]]:
    """Gemma's keys (no extra tensors)."""
    writer.add_key_length(cfg.head_dim)
    writer.add_value_length(cfg.head_dim)
    writer.add_sliding_window(cfg.sliding_window)
    if family == "gemma2":
        writer.add_attn_logit_softcapping(cfg.attn_logit_softcapping)
        writer.add_final_logit_softcapping(cfg.final_logit_softcapping)
        return []
    rope = cfg.rope_parameters
    writer.add_rope_freq_base(rope["full_attention"]["rope_theta"])
    writer.add_rope_freq_base_swa(rope["sliding_attention"]["rope_theta"])
    if cfg.final_logit_softcapping:
        writer.add_final_logit_softcapping(cfg.final_logit_softcapping)
    return []


def _phi3_keys(writer: gguf.GGUFWriter, cfg: Any) -> list[tuple[str, np.ndarray]]:
    """Phi-3's keys; returns the longrope factor tensors it adds (none without longrope)."""
    rope = cfg.rope_parameters
    original = rope.get("original_max_position_embeddings") or cfg.original_max_position_embeddings
    rope_dims = (
        int(rope.get("partial_rotary_factor", 1.0) * cfg.hidden_size) // cfg.num_attention_heads
    )
    writer.add_rope_scaling_orig_ctx_len(original)
    writer.add_rope_dimension_count(rope_dims)
    writer.add_rope_freq_base(rope["rope_theta"])
    writer.add_sliding_window(cfg.sliding_window or 0)
    if rope.get("rope_type") not in ("longrope", "su"):
        return []
    scale = cfg.max_position_embeddings / original
    factor = math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1.0 else 1.0
    writer.add_rope_scaling_attn_factors(factor)
    return [
        ("rope_factors_long.weight", np.asarray(rope["long_factor"], dtype=np.float32)),
        ("rope_factors_short.weight", np.asarray(rope["short_factor"], dtype=np.float32)),
    ]


def write_gguf_family(
    path: Path,
    family: str,
    *,
    qtype: str = "F32",
    seed: int = 0,
    extra_keys: Mapping[str, float] | None = None,
    **config: Any,
) -> Any:
    """A tiny random `family` (gemma2, gemma3_text, phi3) model as a GGUF file; `extra_keys`
    are float32 keys added (or overwritten) after the converter's. Returns the transformers
    model the file was made from (its weights before quantization)."""
    num_tokens = len(_vocab(family)[0])
    shape = {**GGUF_FAMILY_SHAPE[family], **config}
    model = make_hf_model(family, seed=seed, vocab_size=num_tokens, **shape)
    cfg = model.config
    writer = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[GGUF_FAMILY_ARCH[family]])
    add_gguf_shape(writer, cfg)
    tensors = _phi3_keys(writer, cfg) if family == "phi3" else _gemma_keys(writer, cfg, family)
    _add_vocab(writer, family)
    for key, value in (extra_keys or {}).items():
        writer.add_key_value(key, value, gguf.GGUFValueType.FLOAT32)
    names = gguf.get_tensor_name_map(GGUF_FAMILY_ARCH[family], cfg.num_hidden_layers)
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and (family == "gemma2" or cfg.tie_word_embeddings):
            continue  # Gemma 2's converter skips it; a tied one is the embedding
        data = tensor.float().numpy()
        if family != "phi3" and name.endswith("norm.weight"):
            data = data + 1  # Gemma's (1 + weight), added by the converter
        _add_tensor(writer, names.get_name(name, try_suffixes=(".weight", ".bias")), data, qtype)
    for name, data in tensors:
        writer.add_tensor(name, data)
    finish_gguf(writer)
    return model
