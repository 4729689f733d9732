"""The native grouped LoRA product (cpp/src/lora/, core/lora/native.py) against torch in fp32 and
bf16, its batch invariance, and the native decoder stack with adapter rows: a batch mixing three
adapters and the base model gives each request its solo greedy tokens, on the stack, as the
layers one by one do (the same kernels: the same logprobs, bit for bit)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from bench.common.tiny_lora import ATTENTION, MLP, write_peft_adapter
from bench.common.tiny_models import write_gguf_llama
from pagedserve import LLM, SamplingParams
from pagedserve.core.lora.native import native_add, native_applies
from pagedserve.core.lora.weights import LoraBatch, LoraWeights
from pagedserve.core.lora_request import LoRARequest
from pagedserve.core.models.llama import LlamaForCausalLM
from tests.core.lora.oracle import NUM_TOKENS, PROMPTS

PARTS = [48, 16, 16]  # q | k | v
SLOTS = np.array([-1, 0, 0, 2, -1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 0, -1, -1, 2, 1])


def _weights(dtype: torch.dtype, rank: int = 4, max_rank: int = 8) -> LoraWeights:
    """Three slots of random adapters of rank `rank` (< max_rank: padded columns)."""
    gen = torch.Generator().manual_seed(0)
    weights = LoraWeights(40, PARTS, 3, max_rank, dtype)
    for slot in range(3):
        for part, width in enumerate(PARTS):
            a = torch.randn(rank, 40, generator=gen)
            b = torch.randn(width, rank, generator=gen)
            weights.set_slot(slot, part, a, b, scaling=0.5)
    return weights


def _torch_delta(weights: LoraWeights, x: torch.Tensor, slots: np.ndarray) -> torch.Tensor:
    """Each row's (x a[slot]) b[slot] in fp64 (zero for base rows)."""
    delta = torch.zeros(x.shape[0], weights.out_features, dtype=torch.float64)
    for row, slot in enumerate(slots.tolist()):
        if slot >= 0:
            a, b = weights.a[slot].double(), weights.b[slot].double()
            delta[row] = (x[row].double() @ a) @ b
    return delta


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_product_matches_torch(dtype: torch.dtype) -> None:
    weights = _weights(dtype)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(len(SLOTS), 40, generator=gen).to(dtype)
    y0 = torch.randn(len(SLOTS), sum(PARTS), generator=gen).to(dtype)
    batch = LoraBatch.build(SLOTS, dtype)
    assert batch is not None and native_applies(y0, x, weights.a)
    got = weights.add(y0.clone(), x, batch)
    want = y0.double() + _torch_delta(weights, x, SLOTS)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol * 10)
    base = torch.from_numpy(SLOTS < 0)
    assert torch.equal(got[base], y0[base])  # base rows untouched
    # the torch grouped product (the path off the CPU) agrees
    torch_path = weights._add(y0.clone(), x, batch)
    torch.testing.assert_close(torch_path.double(), want, rtol=tol * 4, atol=tol * 40)


def test_a_row_is_the_same_alone_and_in_a_mixed_step() -> None:
    weights = _weights(torch.float32)
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(len(SLOTS), 40, generator=gen)
    y0 = torch.randn(len(SLOTS), sum(PARTS), generator=gen)
    batch = LoraBatch.build(SLOTS, torch.float32)
    assert batch is not None
    mixed = weights.add(y0.clone(), x, batch)
    for row, slot in enumerate(SLOTS.tolist()):
        alone = LoraBatch.build(np.array([slot]), torch.float32)
        y = y0[row : row + 1].clone()
        if alone is not None:
            native_add(y, x[row : row + 1], weights.native_stacks(), alone.segments)
        assert torch.equal(y[0], mixed[row]), row


# --- the native decoder stack with adapter rows ----------------------------------------------


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[LLM, dict[str, LoRARequest]]:
    """A Q8_0 GGUF base kept quantized (the native stack applies: fp32 or bf16) with three
    adapters: attention only, MLP only, every projection."""
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("lora-native")
    path = root / "tiny-Q8_0.gguf"
    write_gguf_llama(path, qtype="Q8_0", seed=7)
    hf = AutoModelForCausalLM.from_pretrained(root, gguf_file=path.name, dtype=torch.float32)
    targets = {"attn": ATTENTION, "mlp": MLP, "all": ATTENTION + MLP}
    loras = {}
    for seed, (name, modules) in enumerate(targets.items()):
        folder = write_peft_adapter(hf, root / name, r=8, targets=modules, seed=seed + 11)
        loras[name] = LoRARequest(name, 0, str(folder))
    llm = LLM(str(path), dtype=request.param, num_pages=64, page_size=8, enable_lora=True,
              max_loras=4, quantized_activations="float", max_num_batched_tokens=64)  # fmt: skip
    return llm, loras


def _model(llm: LLM) -> LlamaForCausalLM:
    model = llm.engine.model_runner.model
    assert isinstance(model, LlamaForCausalLM)
    return model


def _run(
    llm: LLM, loras: list[LoRARequest | None], prompts: list[str]
) -> list[tuple[list[int], list[float]]]:
    params = SamplingParams(temperature=0, max_tokens=NUM_TOKENS, ignore_eos=True, logprobs=0)
    outputs = llm.generate(prompts, params, lora_request=loras)
    result = []
    for o in outputs:
        out = o.outputs[0]
        logprobs = [step.logprob for step in out.logprobs or []]
        result.append((list(out.token_ids), logprobs))
    return result


class _Counting:
    """The model's stack, counting the steps with adapter rows it ran."""

    def __init__(self, stack: Any) -> None:
        self.stack, self.adapter_steps = stack, 0

    @property
    def has_lora(self) -> bool:
        return bool(self.stack.has_lora)

    def __call__(self, *args: Any) -> torch.Tensor:
        self.adapter_steps += len(args) > 5 and args[5] is not None
        out: torch.Tensor = self.stack(*args)
        return out


def test_a_mixed_batch_gives_each_request_its_solo_tokens_on_the_stack(
    served: tuple[LLM, dict[str, LoRARequest]],
) -> None:
    llm, loras = served
    model = _model(llm)
    assert model.stack is not None and model.stack.has_lora  # the native path with adapters
    assert llm.engine.model_info.batch_invariant  # what this test holds it to
    names: list[str | None] = ["attn", "mlp", "all", None]
    row_names = [n for n in names for _ in PROMPTS]
    loras_of = [loras[n] if n else None for n in row_names]
    prompts = PROMPTS * len(names)
    stack, counting = model.stack, _Counting(model.stack)
    model.stack = counting  # type: ignore[assignment]
    try:
        mixed = _run(llm, loras_of, prompts)
    finally:
        model.stack = stack
    assert counting.adapter_steps > 0, "no step with adapter rows ran on the native stack"
    solo = [_run(llm, [lora], [prompt])[0] for lora, prompt in zip(loras_of, prompts, strict=True)]
    assert [t for t, _ in mixed] == [t for t, _ in solo]
    assert [lp for _, lp in mixed] == [lp for _, lp in solo]  # bit for bit
    tokens = {n: [t for (t, _), m in zip(mixed, row_names, strict=True) if m == n] for n in names}
    for name in ("attn", "mlp", "all"):
        assert tokens[name] != tokens[None], f"adapter {name} leaves the tokens as they were"


def test_the_stack_and_the_layers_one_by_one_agree_bit_for_bit(
    served: tuple[LLM, dict[str, LoRARequest]],
) -> None:
    llm, loras = served
    model = _model(llm)
    names: list[str | None] = ["all", None, "attn"]
    loras_of = [loras[n] if n else None for n in names for _ in PROMPTS]
    prompts = PROMPTS * len(names)
    native = _run(llm, loras_of, prompts)
    stack, model.stack = model.stack, None
    try:
        per_layer = _run(llm, loras_of, prompts)
    finally:
        model.stack = stack
    assert native == per_layer


def test_cpu_lora_path_is_named() -> None:
    from pagedserve.core.lora.native import lora_path

    assert lora_path() in ("portable", "avx2", "avx512")
