"""Tiny random Llama-family models written to a folder, for tests anywhere in the suite.

- write_hf_model: an HF folder (config.json + model.safetensors) via transformers.
- write_gguf_model / write_gguf_llama: the same kind of model as a GGUF file (F32 or Q8_0), Llama
  Q/K rows permuted the way llama.cpp's converter does, with the tiny ChatML BPE vocabulary of
  tests/tiny_tokenizers.py and its chat template.
Tokenizer files for the HF folder are not written here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import gguf
import numpy as np
import torch
from tokenizers import Tokenizer

from bench.common.tiny_tokenizers import BPE_SPECIAL_TOKENS, CHATML_TEMPLATE, train_tiny_bpe

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


# Per family, what a tiny test model needs beyond TINY_SHAPE (small experts, top-2 of 4, a
# short window so that prompts cross it, head_dim for Gemma whose default is 256).
FAMILY_SHAPE: dict[str, dict] = {
    "llama": {},
    "qwen2": {},
    "mistral": {},
    "qwen3": {"head_dim": 16},
    "qwen3_moe": {"head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2,
                  "moe_intermediate_size": 32, "norm_topk_prob": True},
    "qwen2_moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                  "shared_expert_intermediate_size": 48},
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2},
    "gemma2": {"head_dim": 16, "query_pre_attn_scalar": 24, "attn_logit_softcapping": None,
               "final_logit_softcapping": 30.0, "sliding_window": 8},
    "gemma3_text": {"head_dim": 16, "query_pre_attn_scalar": 24, "sliding_window": 8},
    "phi3": {"pad_token_id": 0},
}  # fmt: skip


def make_hf_model(architecture: str = "llama", *, seed: int = 0, vocab_size: int = 400, **config):
    """A random transformers model (fp32, eval mode) of any family in FAMILY_SHAPE, through
    AutoConfig.for_model, as a user's checkpoint would be written."""
    from transformers import AutoConfig, AutoModelForCausalLM

    shape = {**TINY_SHAPE, **FAMILY_SHAPE[architecture], "vocab_size": vocab_size, **config}
    cfg = AutoConfig.for_model(architecture, **shape)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).float().eval()
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
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate": "ffn_gate_inp",
    "block_sparse_moe.gate": "ffn_gate_inp",
    "mlp.shared_expert.gate_proj": "ffn_gate_shexp",
    "mlp.shared_expert.up_proj": "ffn_up_shexp",
    "mlp.shared_expert.down_proj": "ffn_down_shexp",
    "mlp.shared_expert_gate": "ffn_gate_inp_shexp",
}
# Our family -> llama.cpp's architecture name (its Mixtral is a "llama" with experts).
GGUF_ARCH = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "qwen3_moe": "qwen3moe",
             "qwen2_moe": "qwen2moe", "mixtral": "llama"}  # fmt: skip
_EXPERT_RE = re.compile(
    r"model\.layers\.(\d+)\.(?:mlp|block_sparse_moe)\.experts\.(\d+)\.(\w+)\.weight"
)
_EXPERT_GGUF = {"gate_proj": "ffn_gate_exps", "w1": "ffn_gate_exps", "up_proj": "ffn_up_exps",
                "w3": "ffn_up_exps", "down_proj": "ffn_down_exps", "w2": "ffn_down_exps"}  # fmt: skip


def _gguf_name(hf_name: str) -> str:
    top = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
    stem, kind = hf_name.rsplit(".", 1)
    if stem in top:
        return f"{top[stem]}.{kind}"
    _, _, layer, rest = stem.split(".", 3)
    return f"blk.{layer}.{_GGUF_LAYER[rest]}.{kind}"


def add_gguf_shape(writer: gguf.GGUFWriter, cfg) -> None:
    """The keys every llama.cpp converter writes from an HF config."""
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)


def finish_gguf(writer: gguf.GGUFWriter) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _add_metadata(writer: gguf.GGUFWriter, cfg, tokenizer: Tokenizer) -> None:
    add_gguf_shape(writer, cfg)
    writer.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    writer.add_rope_dimension_count(head_dim)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    num_experts = getattr(cfg, "num_experts", None) or getattr(cfg, "num_local_experts", 0)
    if num_experts:
        writer.add_expert_count(num_experts)
        writer.add_expert_used_count(cfg.num_experts_per_tok)
        width = getattr(cfg, "moe_intermediate_size", None) or cfg.intermediate_size
        writer.add_expert_feed_forward_length(width)
        if getattr(cfg, "shared_expert_intermediate_size", 0):
            writer.add_expert_shared_feed_forward_length(cfg.shared_expert_intermediate_size)
        if hasattr(cfg, "norm_topk_prob"):
            writer.add_expert_weights_norm(bool(cfg.norm_topk_prob))
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


def _add_tensor(writer: gguf.GGUFWriter, name: str, data: np.ndarray, qtype: str) -> None:
    quant = gguf.GGMLQuantizationType[qtype]
    if data.ndim >= 2 and quant != gguf.GGMLQuantizationType.F32:
        writer.add_tensor(name, gguf.quants.quantize(data, quant), raw_dtype=quant)
    else:
        writer.add_tensor(name, np.ascontiguousarray(data))


def _stacked_experts(writer: gguf.GGUFWriter, name: str, data: np.ndarray, qtype: str) -> None:
    """[experts, 2 width, in] gate/up (gate rows first) or [experts, out, width] down."""
    layer = name.split(".")[2]
    if name.endswith("down_proj"):
        _add_tensor(writer, f"blk.{layer}.ffn_down_exps.weight", data, qtype)
        return
    width = data.shape[1] // 2
    _add_tensor(writer, f"blk.{layer}.ffn_gate_exps.weight", data[:, :width], qtype)
    _add_tensor(writer, f"blk.{layer}.ffn_up_exps.weight", data[:, width:], qtype)


def write_gguf_model(
    path: Path,
    architecture: str = "llama",
    *,
    qtype: str = "F32",
    seed: int = 0,
    tie: bool = False,
    pre: str | None = None,
    **config,
):
    """A tiny random model of a family in GGUF_ARCH as a GGUF file (qtype "F32" or "Q8_0" for
    2-D and expert weights), named and laid out as llama.cpp's converter writes it: Llama (and
    Mixtral) Q/K rows permuted, each layer's experts stacked into one [experts, out, in] tensor.
    `pre`: the tokenizer.ggml.pre to record, none by default.

    Returns the transformers model the file was made from (its weights before quantization)."""
    tokenizer = train_tiny_bpe()
    model = make_hf_model(
        architecture, seed=seed, vocab_size=tokenizer.get_vocab_size(), tie_word_embeddings=tie,
        **config,
    )  # fmt: skip
    cfg = model.config
    writer = gguf.GGUFWriter(str(path), GGUF_ARCH[architecture])
    _add_metadata(writer, cfg, tokenizer)
    if pre is not None:
        writer.add_tokenizer_pre(pre)
    permuted = GGUF_ARCH[architecture] == "llama"  # llama.cpp's converter permutes Llama Q/K
    experts: dict[str, dict[int, np.ndarray]] = {}
    for name, tensor in model.state_dict().items():
        if tie and name == "lm_head.weight":
            continue
        data = tensor.float().numpy()
        if name.endswith((".experts.gate_up_proj", ".experts.down_proj")):
            _stacked_experts(writer, name, data, qtype)  # transformers 5's in-memory layout
            continue
        expert = _EXPERT_RE.fullmatch(name)
        if expert is not None:
            layer, index, proj = expert.groups()
            experts.setdefault(f"blk.{layer}.{_EXPERT_GGUF[proj]}.weight", {})[int(index)] = data
            continue
        if permuted and ".q_proj." in name:
            data = permute_rotary(data, cfg.num_attention_heads)
        elif permuted and ".k_proj." in name:
            data = permute_rotary(data, cfg.num_key_value_heads)
        _add_tensor(writer, _gguf_name(name), data, qtype)
    for name, by_index in experts.items():
        _add_tensor(writer, name, np.stack([by_index[i] for i in sorted(by_index)]), qtype)
    finish_gguf(writer)
    return model


def write_gguf_llama(path: Path, *, qtype: str = "F32", seed: int = 0, tie: bool = False):
    """write_gguf_model for a Llama (Q/K permuted as llama.cpp stores them)."""
    return write_gguf_model(path, "llama", qtype=qtype, seed=seed, tie=tie)
