"""LoRA adapters at tensor_parallel_size 2 (two gloo ranks on the CPU, float32): each adapter
sharded like the linear it modifies (lora/parallel.py). One batch mixing three PEFT adapters
(two of them also as GGUF LoRA files) and the base gives transformers + PEFT's greedy tokens
and TP=1's, up to near-ties; adapters loaded and unloaded at run time reach the worker (a slot
reused by a smaller adapter leaves nothing of the first behind on either rank); a bad adapter
is refused on rank 0 and the ranks keep serving. Fixtures (the tiny Llama: 4 query / 2 KV heads,
an even vocabulary, so 2 divides every size) in conftest.py.

The ranks' all-reduces sum partial products in another order than one rank's sums (the base's
and the row-parallel adapters' alike), so fp32 logits may differ in the last bits: tokens are
compared as tests/core/distributed/test_tensor_parallel.py compares them, up to the first step
whose top-2 logprob gap (at TP=1) is below 1e-3 (in these runs none is, and all tokens match).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from pagedserve import LLM, SamplingParams
from pagedserve.core.lora.parallel import LoraShard, pack_adapter, unpack_adapter
from pagedserve.core.lora.peft import read_peft
from pagedserve.core.lora_request import LoRAError, LoRARequest
from pagedserve.core.models.llama import LlamaForCausalLM
from pagedserve.core.outputs import RequestOutput
from tests.core.distributed.test_tensor_parallel import _tokens_agree
from tests.core.lora.oracle import ADAPTERS, PROMPTS, request

ENGINE = dict(dtype="float32", quantization="none", num_pages=128, page_size=8,
              max_num_batched_tokens=32, enable_lora=True, max_loras=6)  # fmt: skip
GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=2)


@pytest.fixture(scope="module")
def tp_llm(model: tuple[Path, dict[str, Path]]) -> Iterator[LLM]:
    folder, _ = model
    llm = LLM(str(folder), tensor_parallel_size=2, **ENGINE)
    yield llm
    llm.close()


def _mixed(
    names: list[str | None], paths: dict[str, Path]
) -> tuple[list[str], list[LoRARequest | None]]:
    """Every prompt under every name, interleaved so that each step mixes all of them."""
    loras = [request(paths, n) if n else None for n in names for _ in PROMPTS]
    return [p for _ in names for p in PROMPTS], loras


def _tokens(outputs: list[RequestOutput]) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in outputs]


def test_shards_cut_as_the_base_is_cut(model: tuple[Path, dict[str, Path]]) -> None:
    """Column-parallel: B's rows split, A whole; row-parallel: A's columns split, B whole; the
    ranks' products put together are the whole adapter's (B rows stacked; x A B summed), and
    the broadcast's packing gives the adapter back bit for bit."""
    adapter = read_peft(model[1]["all"])
    a, b, scaling = adapter.modules[(0, "q_proj")]
    cuts = [LoraShard("out", r, 2).cut(a, b) for r in range(2)]
    assert all(torch.equal(ra, a) for ra, _ in cuts)
    assert torch.equal(torch.cat([rb for _, rb in cuts]), b)
    a, b, _ = adapter.modules[(0, "down_proj")]
    x = torch.randn(3, a.shape[1], dtype=torch.float64)
    cuts = [LoraShard("in", r, 2).cut(a, b) for r in range(2)]
    k = a.shape[1] // 2
    total = sum(x[:, r * k : (r + 1) * k] @ ra.double().t() @ rb.double().t()
                for r, (ra, rb) in enumerate(cuts))  # fmt: skip
    torch.testing.assert_close(total, x @ a.double().t() @ b.double().t())
    assert LoraShard("in", 1, 2).whole(k, b.shape[0]) == (a.shape[1], b.shape[0])
    back = unpack_adapter(*pack_adapter(adapter))
    assert back.rank == adapter.rank and sorted(back.modules) == sorted(adapter.modules)
    for key, (a, b, scaling) in adapter.modules.items():
        a2, b2, scaling2 = back.modules[key]
        assert torch.equal(a2, a) and torch.equal(b2, b) and scaling2 == scaling, key


def test_three_adapters_and_the_base_in_one_batch_at_tp2(
    model: tuple[Path, dict[str, Path]],
    tp_llm: LLM,
    llm: LLM,
    oracle: dict[str | None, list[list[int]]],
) -> None:
    """PEFT folders loaded on first use (rank 0 reads, every rank writes its share), three
    adapters and the base in every step: PEFT's tokens, and TP=1's up to near-ties."""
    _, adapters = model
    names: list[str | None] = [*ADAPTERS, None]
    prompts, loras = _mixed(names, adapters)
    parallel = tp_llm.generate(prompts, GREEDY, lora_request=loras)
    single = llm.generate(prompts, GREEDY, lora_request=loras)
    for ref, got in zip(single, parallel, strict=True):
        _tokens_agree(ref, got)
    assert _tokens(parallel) == [t for n in names for t in oracle[n]]
    served = tp_llm.engine.model_runner.model
    assert isinstance(served, LlamaForCausalLM) and served.stack is None  # layer by layer


def test_gguf_adapters_mixed_with_peft_and_the_base_at_tp2(
    model: tuple[Path, dict[str, Path]],
    gguf_adapters: dict[str, Path],
    tp_llm: LLM,
    oracle: dict[str | None, list[list[int]]],
) -> None:
    """GGUF LoRA files (q/k's B in llama.cpp's rotary order, put back in HF's on rank 0 with the
    whole model's head counts before any rank cuts its rows) beside a PEFT adapter and the base."""
    _, adapters = model
    files = {f"{name}.gguf": path for name, path in gguf_adapters.items()}
    names: list[str | None] = ["all.gguf", "mlp", "attn.gguf", None]
    prompts, loras = _mixed(names, {**files, **adapters})
    got = _tokens(tp_llm.generate(prompts, GREEDY, lora_request=loras))
    assert got == [t for n in names for t in oracle[n.removesuffix(".gguf") if n else None]]


def test_load_unload_and_refusals_at_tp2(
    model: tuple[Path, dict[str, Path]],
    tp_llm: LLM,
    oracle: dict[str | None, list[list[int]]],
    tmp_path: Path,
) -> None:
    """Run-time loads and unloads reach the worker: "all" (every module, rank 16) is unloaded
    while its requests run (they finish with it), then "mlp" takes its slot; the worker's share
    of the slot must have been cleared, else "all"'s attention weights would stay on rank 1.
    Refusals leave both ranks serving."""
    _, adapters = model
    engine = tp_llm.engine
    for name in [r.lora_name for r in engine.list_loras()]:
        engine.remove_lora(name)
    first = engine.add_lora("all", str(adapters["all"]))
    slot = engine.model_runner.lora._slot[first.lora_int_id]  # type: ignore[union-attr]
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(f"tp-all-{i}", tp_llm.tokenizer.encode(prompt), GREEDY,
                           lora_request=first)  # fmt: skip
    done = {d.request_id: d for d in engine.step()}
    engine.remove_lora("all")  # while its requests run: the slot is cleared once they finish
    assert slot in engine.model_runner.lora._retired  # type: ignore[union-attr]
    while engine.has_unfinished():
        for delta in engine.step():
            if delta.request_id in done:
                done[delta.request_id].merge(delta)
            else:
                done[delta.request_id] = delta
    assert _tokens([done[f"tp-all-{i}"] for i in range(len(PROMPTS))]) == oracle["all"]
    second = engine.add_lora("mlp", str(adapters["mlp"]))
    assert engine.model_runner.lora._slot[second.lora_int_id] == slot  # type: ignore[union-attr]
    assert _tokens(tp_llm.generate(PROMPTS, GREEDY, lora_request=second)) == oracle["mlp"]
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "adapter_config.json").write_text('{"r": 8, "lora_alpha": 16}')
    (broken / "adapter_model.safetensors").write_bytes(b"not safetensors" * 10)
    with pytest.raises(LoRAError, match="not a readable safetensors file"):
        engine.add_lora("broken", str(broken))
    with pytest.raises(LoRAError, match="neither a folder"):
        engine.add_lora("missing", str(tmp_path / "missing.safetensors"))
    assert [r.lora_name for r in engine.list_loras()] == ["mlp"]
    both = tp_llm.generate(PROMPTS * 2, GREEDY, lora_request=[second] * 3 + [None] * 3)
    assert _tokens(both) == oracle["mlp"] + oracle[None]
