"""LoRA adapters against transformers + PEFT in fp32 on a tiny random Llama: each adapter's
greedy tokens alone, the same in one batch mixing three adapters and the base model, and the
same as PEFT's adapter merged into the weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bench.common.tiny_lora import ATTENTION, MLP, write_peft_adapter
from bench.common.tiny_models import make_hf_model
from bench.common.tiny_tokenizers import write_tiny_bpe
from pagedserve import LLM, SamplingParams
from pagedserve.core.lora_request import LoRARequest

pytest.importorskip("peft")

PROMPTS = ["the quick brown fox", "hello world, this is", "Once upon a time 42"]
NUM_TOKENS = 16
GREEDY = SamplingParams(temperature=0, max_tokens=NUM_TOKENS, ignore_eos=True)
ADAPTERS = {  # name -> (rank, alpha, targets, rsLoRA)
    "attn": (8, 16, ATTENTION, False),
    "mlp": (4, 8, MLP, True),
    "all": (16, 16, ATTENTION + MLP, False),
}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path]]:
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


@pytest.fixture(scope="module")
def llm(model: tuple[Path, dict[str, Path]]) -> LLM:
    folder, _ = model
    return LLM(str(folder), dtype="float32", quantization="none", num_pages=128, page_size=8,
               max_num_batched_tokens=32, enable_lora=True, max_loras=4)  # fmt: skip


def hf_tokens(hf_model: torch.nn.Module, prompts: list[list[int]]) -> list[list[int]]:
    result = []
    for ids in prompts:
        with torch.no_grad():
            out = hf_model.generate(
                torch.tensor([ids]), do_sample=False, max_new_tokens=NUM_TOKENS,
                min_new_tokens=NUM_TOKENS, eos_token_id=None, pad_token_id=0,
            )  # fmt: skip
        result.append(out[0, len(ids) :].tolist())
    return result


@pytest.fixture(scope="module")
def oracle(model: tuple[Path, dict[str, Path]], llm: LLM) -> dict[str | None, list[list[int]]]:
    """transformers' greedy tokens: the base (None), each adapter unmerged, and "<name>+merged"."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    folder, adapters = model
    prompts = [llm.tokenizer.encode(p) for p in PROMPTS]

    def base() -> torch.nn.Module:
        return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: threads only add barriers (slow on a busy host)
    try:
        tokens: dict[str | None, list[list[int]]] = {None: hf_tokens(base(), prompts)}
        for name, path in adapters.items():
            peft_model = PeftModel.from_pretrained(base(), path).eval()
            tokens[name] = hf_tokens(peft_model, prompts)
            tokens[name + "+merged"] = hf_tokens(peft_model.merge_and_unload(), prompts)
    finally:
        torch.set_num_threads(threads)
    return tokens


def request(adapters: dict[str, Path], name: str) -> LoRARequest:
    return LoRARequest(name, 0, str(adapters[name]))


def ours(llm: LLM, loras: list[LoRARequest | None]) -> list[list[int]]:
    outputs = llm.generate(PROMPTS * (len(loras) // len(PROMPTS)), GREEDY, lora_request=loras)
    return [list(o.outputs[0].token_ids) for o in outputs]


def test_each_adapter_alone_matches_peft(
    model: tuple[Path, dict[str, Path]], llm: LLM, oracle: dict[str | None, list[list[int]]]
) -> None:
    _, adapters = model
    for name in ADAPTERS:
        assert oracle[name] != oracle[None], f"adapter {name} leaves the tokens as they were"
        assert oracle[name] == oracle[name + "+merged"], name  # PEFT agrees with itself
        assert ours(llm, [request(adapters, name)] * len(PROMPTS)) == oracle[name], name
    assert ours(llm, [None] * len(PROMPTS)) == oracle[None]


def test_three_adapters_and_the_base_in_one_batch(
    model: tuple[Path, dict[str, Path]], llm: LLM, oracle: dict[str | None, list[list[int]]]
) -> None:
    _, adapters = model
    names: list[str | None] = [*ADAPTERS, None]
    # every prompt under every adapter, interleaved so that each step mixes all four
    loras = [request(adapters, n) if n else None for n in names for _ in PROMPTS]
    prompts = [p for _ in names for p in PROMPTS]
    outputs = llm.generate(prompts, GREEDY, lora_request=loras)
    got = [list(o.outputs[0].token_ids) for o in outputs]
    want = [t for n in names for t in oracle[n]]
    assert got == want


def test_the_prefix_cache_keeps_adapters_apart(
    model: tuple[Path, dict[str, Path]], llm: LLM, oracle: dict[str | None, list[list[int]]]
) -> None:
    """A long shared prompt cached under one adapter is not reused by another (or the base)."""
    _, adapters = model
    prompt = llm.tokenizer.encode("Numbers: 7 8 9 and more words here " * 4)  # unseen before
    first = llm.generate([prompt], GREEDY, lora_request=request(adapters, "attn"))
    stats = llm.engine.scheduler.stats()
    base = llm.generate([prompt], GREEDY)
    after = llm.engine.scheduler.stats()
    assert after.prefix_hit_tokens == stats.prefix_hit_tokens  # nothing shared with the base
    again = llm.generate([prompt], GREEDY, lora_request=request(adapters, "attn"))
    assert llm.engine.scheduler.stats().prefix_hit_tokens > after.prefix_hit_tokens
    assert again[0].outputs[0].token_ids == first[0].outputs[0].token_ids
    assert base[0].outputs[0].token_ids != first[0].outputs[0].token_ids


def test_an_adapter_on_gguf_blocks_kept_quantized(tmp_path: Path) -> None:
    """A Q8_0 GGUF base keeps its blocks quantized (fp32 activations); the adapter, on every
    projection (the gated MLP's too), gives PEFT's tokens on transformers' dequantized copy."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from bench.common.tiny_models import write_gguf_llama

    path = tmp_path / "tiny-Q8_0.gguf"
    write_gguf_llama(path, qtype="Q8_0", seed=5)
    hf = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name, dtype=torch.float32)
    adapter = write_peft_adapter(hf, tmp_path / "adapter", r=8, targets=ATTENTION + MLP, seed=4)
    llm = LLM(
        str(path),
        dtype="float32",
        num_pages=64,
        page_size=8,
        enable_lora=True,
        quantized_activations="float",
    )  # no int8 rounding: transformers has none
    assert "kept quantized" in llm.engine.model_info.weights
    prompts = [llm.tokenizer.encode(p) for p in PROMPTS]
    lora = LoRARequest("q8", 0, str(adapter))
    outputs = llm.generate(PROMPTS, GREEDY, lora_request=lora)
    ours = [list(o.outputs[0].token_ids) for o in outputs]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        want = hf_tokens(PeftModel.from_pretrained(hf.eval(), adapter).eval(), prompts)
    finally:
        torch.set_num_threads(threads)
    assert ours == want
