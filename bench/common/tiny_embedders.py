"""Tiny random Qwen3-style embedding models, for the embeddings tests and bench.

- write_tiny_embedder: an HF folder as sentence-transformers lays one out (modules.json,
  1_Pooling/config.json, 2_Normalize, config_sentence_transformers.json) around a Qwen3
  backbone written by transformers: a bare `Qwen3Model` (as Qwen3-Embedding ships) or, with
  `lm_head=True`, a `Qwen3ForCausalLM` that can also generate.
- write_gguf_embedder: the same kind of model as a GGUF file with `qwen3.pooling_type`.

The tokenizer is tests/tiny_tokenizers.py's BPE with a pad token and no chat template
(sentence-transformers >= 6 wraps texts in a tokenizer's chat template when it has one).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from unittest import mock

import gguf
import torch

import bench.common.tiny_models as tiny_models
from bench.common.tiny_tokenizers import write_tiny_bpe

# sentence-transformers' pooling_mode strings, as 1_Pooling/config.json has them.
ST_POOLING = ("lasttoken", "mean", "cls")
_ST = "sentence_transformers.models."


def _write_json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2), encoding="utf-8")


def _write_tokenizer(folder: Path) -> int:
    """The tiny BPE with `<|endoftext|>` as pad and no chat template; returns its size."""
    write_tiny_bpe(folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    config["pad_token"] = "<|endoftext|>"
    _write_json(folder / "tokenizer_config.json", config)
    return len(json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"])


def write_tiny_embedder(
    folder: Path,
    *,
    pooling: str = "lasttoken",
    normalize: bool = True,
    lm_head: bool = False,
    seed: int = 0,
    prompts: dict[str, str] | None = None,
    default_prompt_name: str | None = None,
    sentence_transformers: bool = True,
    **config: Any,
) -> torch.nn.Module:
    """Write the folder; returns the transformers backbone (fp32, eval) the files hold.
    `config`: Qwen3 config fields over tests/tiny_models.py's tiny shape (and config.json
    extras such as is_matryoshka)."""
    vocab_size = _write_tokenizer(folder)
    model = tiny_models.make_hf_model("qwen3", seed=seed, vocab_size=vocab_size, **config)
    (model if lm_head else model.model).save_pretrained(folder, safe_serialization=True)
    if sentence_transformers:
        write_st_files(folder, model.config.hidden_size, pooling, normalize, prompts,
                       default_prompt_name)  # fmt: skip
    return model.model


def write_st_files(
    folder: Path,
    hidden_size: int,
    pooling: str = "lasttoken",
    normalize: bool = True,
    prompts: dict[str, str] | None = None,
    default_prompt_name: str | None = None,
) -> None:
    """sentence-transformers' module files, as the Hub's decoder-only embedders have them."""
    assert pooling in ST_POOLING, pooling
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": _ST + "Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": _ST + "Pooling"},
    ]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": _ST + "Normalize"})
        (folder / "2_Normalize").mkdir(exist_ok=True)
    _write_json(folder / "modules.json", modules)
    _write_json(
        folder / "1_Pooling" / "config.json",
        {"word_embedding_dimension": hidden_size, "pooling_mode": pooling, "include_prompt": True},
    )
    _write_json(folder / "sentence_bert_config.json", {"max_seq_length": 4096})
    _write_json(
        folder / "config_sentence_transformers.json",
        {"prompts": prompts or {}, "default_prompt_name": default_prompt_name,
         "similarity_fn_name": "cosine"},
    )  # fmt: skip


def write_gguf_embedder(path: Path, pooling_type: int, *, seed: int = 0) -> torch.nn.Module:
    """A tiny Qwen3 GGUF (F32) whose metadata says `qwen3.pooling_type` (llama.cpp's enum:
    1 mean, 2 cls, 3 last, 0 none, 4 rank); returns the transformers backbone it holds."""
    finish = tiny_models.finish_gguf

    def with_pooling(writer: gguf.GGUFWriter) -> None:
        writer.add_pooling_type(gguf.PoolingType(pooling_type))
        finish(writer)

    with mock.patch.object(tiny_models, "finish_gguf", with_pooling):
        model = tiny_models.write_gguf_model(path, "qwen3", seed=seed)
    return model.model


def pool_by_hand(hidden: torch.Tensor, pooling: str, normalize: bool = True) -> torch.Tensor:
    """hidden: [num_tokens, hidden] of one text -> its vector (the obvious formulas)."""
    if pooling in ("last", "lasttoken"):
        vector = hidden[-1]
    elif pooling == "mean":
        vector = hidden.mean(dim=0)
    else:
        vector = hidden[0]
    return torch.nn.functional.normalize(vector, dim=0) if normalize else vector


def hidden_states(backbone: torch.nn.Module, token_ids: list[int]) -> torch.Tensor:
    """The backbone's final-norm output for one text, [num_tokens, hidden] fp32."""
    with torch.no_grad():
        return backbone(torch.tensor([token_ids])).last_hidden_state[0].float()
