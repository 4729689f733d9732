"""Tiny random Llama-family models written to a folder, for tests anywhere in the suite.

- write_hf_model: an HF folder (config.json + model.safetensors) via transformers.
- write_gguf_model / write_gguf_llama: the same kind of model as a GGUF file (F32 or Q8_0), Llama
  Q/K rows permuted the way llama.cpp's converter does, with the tiny ChatML BPE vocabulary of
  tests/tiny_tokenizers.py and its chat template.
Tokenizer files for the HF folder are not written here.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import torch
from tokenizers import Tokenizer

from tests.tiny_tokenizers import BPE_SPECIAL_TOKENS, CHATML_TEMPLATE, train_tiny_bpe

TINY_SHAPE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
)


def randomize_(model: torch.nn.Module, seed: int, std: float = 0.08) -> None:
    """Random weights everywhere, norms around 1 (HF's init leaves them at exactly 1)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen) * std
            p.copy_(1.0 + noise if "norm" in name else noise)


def make_hf_model(architecture: str = "llama", *, seed: int = 0, vocab_size: int = 400, **config):
    """A random transformers model (fp32, eval mode): "llama" or "qwen2"."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    classes = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}
    config_cls, model_cls = classes[architecture]
    cfg = config_cls(**{**TINY_SHAPE, "vocab_size": vocab_size, **config})
    torch.manual_seed(seed)
    model = model_cls(cfg).float().eval()
    randomize_(model, seed)
    if cfg.tie_word_embeddings:
        model.tie_weights()
    return model


def write_hf_model(folder: Path, architecture: str = "llama", *, seed: int = 0, **config) -> Path:
    """An HF folder with config.json and model.safetensors; returns the folder."""
    model = make_hf_model(architecture, seed=seed, **config)
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def permute_rotary(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's converter layout: each head's rotary halves interleaved row by row."""
    shape = weight.shape
    head = shape[0] // num_heads
    return weight.reshape(num_heads, 2, head // 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


_GGUF_LAYER = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def _gguf_name(hf_name: str) -> str:
    top = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
    stem, kind = hf_name.rsplit(".", 1)
    if stem in top:
        return f"{top[stem]}.{kind}"
    _, _, layer, rest = stem.split(".", 3)
    return f"blk.{layer}.{_GGUF_LAYER[rest]}.{kind}"


def _add_metadata(writer: gguf.GGUFWriter, cfg, tokenizer: Tokenizer) -> None:
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    writer.add_vocab_size(cfg.vocab_size)
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([tok for tok, _ in vocab])
    specials = set(BPE_SPECIAL_TOKENS)
    writer.add_token_types([3 if tok in specials else 1 for tok, _ in vocab])
    merges = json.loads(tokenizer.to_str())["model"]["merges"]  # [[left, right], ...]
    writer.add_token_merges([" ".join(m) for m in merges])
    writer.add_bos_token_id(1)  # <|im_start|>
    writer.add_eos_token_id(2)  # <|im_end|>
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHATML_TEMPLATE)


def write_gguf_model(
    path: Path,
    architecture: str = "llama",
    *,
    qtype: str = "F32",
    seed: int = 0,
    tie: bool = False,
    pre: str | None = None,
):
    """A tiny random "llama" or "qwen2" as a GGUF file (qtype "F32" or "Q8_0" for 2-D weights;
    `pre`: the tokenizer.ggml.pre to record, none by default).

    Returns the transformers model the file was made from (its weights before quantization)."""
    tokenizer = train_tiny_bpe()
    model = make_hf_model(
        architecture, seed=seed, vocab_size=tokenizer.get_vocab_size(), tie_word_embeddings=tie
    )
    cfg = model.config
    writer = gguf.GGUFWriter(str(path), architecture)
    _add_metadata(writer, cfg, tokenizer)
    if pre is not None:
        writer.add_tokenizer_pre(pre)
    quant = gguf.GGMLQuantizationType[qtype]
    permuted = architecture == "llama"  # llama.cpp's converter permutes Llama Q/K only
    for name, tensor in model.state_dict().items():
        if tie and name == "lm_head.weight":
            continue
        data = tensor.float().numpy()
        if permuted and ".q_proj." in name:
            data = permute_rotary(data, cfg.num_attention_heads)
        elif permuted and ".k_proj." in name:
            data = permute_rotary(data, cfg.num_key_value_heads)
        if data.ndim == 2 and quant != gguf.GGMLQuantizationType.F32:
            writer.add_tensor(_gguf_name(name), gguf.quants.quantize(data, quant), raw_dtype=quant)
        else:
            writer.add_tensor(_gguf_name(name), np.ascontiguousarray(data))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model


def write_gguf_llama(path: Path, *, qtype: str = "F32", seed: int = 0, tie: bool = False):
    """write_gguf_model for a Llama (Q/K permuted as llama.cpp stores them)."""
    return write_gguf_model(path, "llama", qtype=qtype, seed=seed, tie=tie)
