"""The oracle on tiny random models made here: both loaders (safetensors, GGUF), both
tokenizer kinds (BPE, SentencePiece), two families (Llama, Qwen2). pagedserve in fp32 must give
exactly transformers' greedy tokens for 64 new tokens, through the whole engine."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest
import torch

from bench.common.tiny_models import write_gguf_llama, write_hf_model
from bench.common.tiny_tokenizers import write_tiny_bpe, write_tiny_spm
from pagedserve import LLM, SamplingParams

PROMPTS = ["the quick brown fox", "hello world, this is", "Once upon a time 42"]
GREEDY = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)


def engine_tokens(model: str) -> tuple[LLM, list[list[int]]]:
    # A small token budget forces chunked prefill on the longer prompts as well.
    llm = LLM(model, dtype="float32", quantization="none", num_pages=64, page_size=8,
              max_num_batched_tokens=16)  # fmt: skip
    return llm, [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)]


def transformers_tokens(hf_model: torch.nn.Module, llm: LLM, hf_tokenizer) -> list[list[int]]:
    result = []
    for prompt in PROMPTS:
        ids = llm.tokenizer.encode(prompt)
        assert ids == hf_tokenizer(prompt)["input_ids"], prompt  # same tokens in
        with torch.no_grad():
            out = hf_model.generate(
                torch.tensor([ids]),
                do_sample=False,
                max_new_tokens=64,
                min_new_tokens=64,
                eos_token_id=None,
                pad_token_id=0,
            )
        result.append(out[0, len(ids) :].tolist())
    return result


@pytest.mark.parametrize(
    ("architecture", "tokenizer_kind"), [("llama", "bpe"), ("qwen2", "bpe"), ("llama", "spm")]
)
def test_hf_folder_matches_transformers(
    tmp_path: Path, architecture: str, tokenizer_kind: str
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = tmp_path / "model"
    write = write_tiny_bpe if tokenizer_kind == "bpe" else write_tiny_spm
    write(folder)
    vocab_size = len(AutoTokenizer.from_pretrained(folder))
    write_hf_model(folder, architecture, seed=3, vocab_size=vocab_size)
    llm, ours = engine_tokens(str(folder))
    hf_model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    assert ours == transformers_tokens(hf_model, llm, AutoTokenizer.from_pretrained(folder))


@pytest.mark.parametrize("qtype", ["F32", "Q8_0"])
def test_gguf_file_matches_transformers(tmp_path: Path, qtype: str) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = tmp_path / f"tiny-{qtype}.gguf"
    write_gguf_llama(path, qtype=qtype, seed=5)
    llm, ours = engine_tokens(str(path))
    hf_model = AutoModelForCausalLM.from_pretrained(
        tmp_path, gguf_file=path.name, dtype=torch.float32
    ).eval()
    hf_tokenizer = AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    assert ours == transformers_tokens(hf_model, llm, hf_tokenizer)


def test_a_dropped_engine_is_freed_at_once(tmp_path: Path) -> None:
    """Nothing the engine holds points back to it: dropping the last reference frees its weights
    and KV cache then, not whenever the cyclic garbage collector next runs (a process that makes
    engine after engine, as this suite does, would otherwise hold several at once)."""
    write_gguf_llama(tmp_path / "tiny.gguf", seed=5)
    llm, _ = engine_tokens(str(tmp_path / "tiny.gguf"))
    engine, kv_cache = weakref.ref(llm.engine), weakref.ref(llm.engine.model_runner.kv_caches[0])
    gc.disable()
    try:
        del llm
        assert engine() is None and kv_cache() is None
    finally:
        gc.enable()
