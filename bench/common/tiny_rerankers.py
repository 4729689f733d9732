"""Tiny random Qwen3-Reranker-style models, for the rerank tests and bench.

write_tiny_reranker: an HF folder holding a transformers `Qwen3ForCausalLM` of tests'
tiny shape and a tiny byte-level BPE trained with "yes" and "no" as whole tokens (and ChatML's
special tokens, which Qwen3-Reranker's template uses). transformers_scores is the oracle: the
same template, softmax([logit(no), logit(yes)])[1] at the last position, in fp32.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from bench.common.tiny_models import make_hf_model
from bench.common.tiny_tokenizers import BPE_SPECIAL_TOKENS, TRAINING_CORPUS, train_tiny_bpe
from pagedserve.core.pooling_params import ScoreConfig

_CORPUS = [*TRAINING_CORPUS, *["yes", "no", "Answer: yes", "Answer: no"] * 30]


def write_tiny_reranker(folder: Path, *, seed: int = 0, **config: Any) -> torch.nn.Module:
    """Write the folder; returns the transformers model (fp32, eval) it holds. `config`:
    config.json extras (classifier_from_token, score_template, score_instruction) or Qwen3
    shape fields."""
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tiny_bpe(400, BPE_SPECIAL_TOKENS, _CORPUS)
    for token in ("yes", "no"):
        assert tokenizer.token_to_id(token) is not None, token
    tokenizer.save(str(folder / "tokenizer.json"))
    tokenizer_config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>",
                        "pad_token": "<|endoftext|>", "add_bos_token": False}  # fmt: skip
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config), encoding="utf-8")
    extras = {k: config.pop(k) for k in list(config) if k.startswith(("classifier", "score_"))}
    model = make_hf_model("qwen3", seed=seed, vocab_size=tokenizer.get_vocab_size(), **config)
    model.save_pretrained(folder, safe_serialization=True)
    if extras:
        path = folder / "config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **extras}), encoding="utf-8")
    return model


def transformers_scores(
    folder: Path, model: torch.nn.Module, query: str, documents: list[str], score: ScoreConfig
) -> list[float]:
    """The oracle: each (query, document) prompt through transformers one at a time, fp32."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    no, yes = (tokenizer.convert_tokens_to_ids(t) for t in score.tokens)
    out = []
    with torch.no_grad():
        for document in documents:
            ids = tokenizer(score.render(query, document), return_tensors="pt").input_ids
            logits = model(ids).logits[0, -1].float()
            out.append(float(torch.softmax(logits[[no, yes]], dim=-1)[1]))
    return out
