"""LoRA adapters against transformers + PEFT in fp32 on a tiny random Llama: each adapter's
greedy tokens alone, the same in one batch mixing three adapters and the base model, and the
same as PEFT's adapter merged into the weights (fixtures in conftest.py)."""

from __future__ import annotations

from pathlib import Path

from pagedserve import LLM
from pagedserve.core.lora_request import LoRARequest
from tests.core.lora.oracle import ADAPTERS, GREEDY, PROMPTS, QuantizedBase, ours, request


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


def test_an_adapter_on_gguf_blocks_kept_quantized(quantized: QuantizedBase) -> None:
    """A Q8_0 GGUF base keeps its blocks quantized (fp32 activations); the adapter, on every
    projection (the gated MLP's too), gives PEFT's tokens on transformers' dequantized copy."""
    assert "kept quantized" in quantized.llm.engine.model_info.weights
    lora = LoRARequest("q8", 0, str(quantized.adapter))
    outputs = quantized.llm.generate(PROMPTS, GREEDY, lora_request=lora)
    assert [list(o.outputs[0].token_ids) for o in outputs] == quantized.want
