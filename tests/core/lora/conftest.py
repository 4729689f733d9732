"""Fixtures the LoRA tests share, once per session: the tiny Llama with its PEFT adapters, an
`LLM` serving it, transformers + PEFT's tokens, and a Q8_0 GGUF base with its adapter."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bench.common.tiny_lora import ATTENTION, MLP, write_peft_adapter
from bench.common.tiny_models import make_hf_model, write_gguf_llama
from bench.common.tiny_tokenizers import write_tiny_bpe
from pagedserve import LLM
from tests.core.lora.gguf_lora import gguf_from_peft
from tests.core.lora.oracle import ADAPTERS, PROMPTS, QuantizedBase, hf_tokens

pytest.importorskip("peft")


@pytest.fixture(scope="session")
def model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path]]:
    """The base's HF folder and each of ADAPTERS' PEFT folders."""
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("lora")
    folder = root / "base"
    write_tiny_bpe(folder)
    vocab_size = len(AutoTokenizer.from_pretrained(folder))
    base = make_hf_model("llama", seed=3, vocab_size=vocab_size)
    base.save_pretrained(folder, safe_serialization=True)
    adapters = {}
    for seed, (name, (r, alpha, targets, rslora)) in enumerate(ADAPTERS.items()):
        adapters[name] = write_peft_adapter(
            base, root / name, r=r, alpha=alpha, targets=targets, seed=seed + 1, rslora=rslora
        )
    return folder, adapters


@pytest.fixture(scope="session")
def llm(model: tuple[Path, dict[str, Path]]) -> LLM:
    folder, _ = model
    return LLM(str(folder), dtype="float32", quantization="none", num_pages=128, page_size=8,
               max_num_batched_tokens=32, enable_lora=True, max_loras=6)  # fmt: skip


@pytest.fixture(scope="session")
def oracle(model: tuple[Path, dict[str, Path]], llm: LLM) -> dict[str | None, list[list[int]]]:
    """transformers' greedy tokens: the base (None), each adapter unmerged, and "<name>+merged"."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    folder, adapters = model
    prompts = [llm.tokenizer.encode(p) for p in PROMPTS]

    def base() -> torch.nn.Module:
        return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()

    tokens: dict[str | None, list[list[int]]] = {None: hf_tokens(base(), prompts)}
    for name, path in adapters.items():
        peft_model = PeftModel.from_pretrained(base(), path).eval()
        tokens[name] = hf_tokens(peft_model, prompts)
        tokens[name + "+merged"] = hf_tokens(peft_model.merge_and_unload(), prompts)
    return tokens


@pytest.fixture(scope="session")
def gguf_adapters(
    model: tuple[Path, dict[str, Path]], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    """ "attn" and "all" as f32 GGUF files (not "mlp": the converter drops its rsLoRA)."""
    _, adapters = model
    root = tmp_path_factory.mktemp("gguf-lora")
    return {name: gguf_from_peft(adapters[name], root / f"{name}.gguf", alpha=ADAPTERS[name][1])
            for name in ("attn", "all")}  # fmt: skip


@pytest.fixture(scope="session")
def quantized(tmp_path_factory: pytest.TempPathFactory) -> QuantizedBase:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("lora-q8")
    path = root / "tiny-Q8_0.gguf"
    write_gguf_llama(path, qtype="Q8_0", seed=5)
    hf = AutoModelForCausalLM.from_pretrained(root, gguf_file=path.name, dtype=torch.float32)
    adapter = write_peft_adapter(hf, root / "adapter", r=8, targets=ATTENTION + MLP, seed=4)
    llm = LLM(str(path), dtype="float32", num_pages=64, page_size=8, enable_lora=True,
              quantized_activations="float")  # fmt: skip
    prompts = [llm.tokenizer.encode(p) for p in PROMPTS]
    want = hf_tokens(PeftModel.from_pretrained(hf.eval(), adapter).eval(), prompts)
    return QuantizedBase(path, adapter, llm, want)
