"""Tensor parallelism on the CPU (gloo, float32): TP=2 gives TP=1's tokens, greedy and seeded,
for a dense and a sparse (MoE) model; prompt logprobs agree; sizes that do not divide are refused
at start-up, the default model (9 query / 3 KV heads) included.

The all-reduce sums the two ranks' partial products in another order than one rank's single
sum, so fp32 logits may differ in the last bits: greedy tokens are compared up to the first step
whose top-2 logprob gap (at TP=1) is below 1e-3, where such a difference could flip the choice
(in these runs none does, and the whole sequences match)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from bench.common.tiny_models import write_gguf_llama
from pagedserve import LLM, SamplingParams
from pagedserve.core.errors import EngineDeadError
from pagedserve.core.models.registry import read_arch
from pagedserve.core.models.resolve import ResolvedModel
from pagedserve.core.models.tensor_parallel import check_divisible, shard_arch, shard_weight
from pagedserve.core.outputs import RequestOutput
from tests.core.distributed.conftest import write_tp_model

PROMPTS = ["the quick brown fox", "hello world, this is", "Once upon a time 42"]
ENGINE = dict(dtype="float32", num_pages=64, page_size=8, max_num_batched_tokens=16)
GAP = 1e-3


def _generate(model: Path, params: SamplingParams, tp: int) -> list[RequestOutput]:
    llm = LLM(str(model), tensor_parallel_size=tp, **ENGINE)
    try:
        return llm.generate(PROMPTS, params)
    finally:
        llm.close()


def _tokens_agree(reference: RequestOutput, other: RequestOutput) -> None:
    """Equal tokens, or equal up to a step where TP=1's top two were within GAP."""
    ref, got = reference.outputs[0], other.outputs[0]
    for step, (a, b) in enumerate(zip(ref.token_ids, got.token_ids, strict=True)):
        if a != b:
            assert ref.logprobs is not None
            top = sorted((lp for _, lp in ref.logprobs[step].top), reverse=True)
            assert top[0] - top[1] < GAP, f"step {step}: {a} != {b} with a gap of {top[0] - top[1]}"
            return


@pytest.mark.parametrize("architecture", ["llama", "qwen2_moe", "gguf"])
def test_greedy_tp2_matches_tp1(tmp_path: Path, architecture: str) -> None:
    """An HF Llama, an MoE with a shared expert (experts' widths split), and a Q8_0 GGUF Llama
    (dequantized at load, then split like any other weight)."""
    if architecture == "gguf":
        model = tmp_path / "tiny.gguf"
        write_gguf_llama(model, qtype="Q8_0", seed=5)
    else:
        model = write_tp_model(tmp_path / architecture, architecture)
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=2)
    reference, parallel = _generate(model, greedy, 1), _generate(model, greedy, 2)
    for ref, got in zip(reference, parallel, strict=True):
        _tokens_agree(ref, got)
    assert [o.outputs[0].token_ids for o in parallel] == [o.outputs[0].token_ids for o in reference]


def test_seeded_sampling_and_prompt_logprobs_match(tp_model: Path) -> None:
    """Seeded sampling happens on rank 0 only, over the gathered logits: the same draws."""
    params = SamplingParams(temperature=0.9, top_p=0.95, seed=11, max_tokens=16,
                            ignore_eos=True, prompt_logprobs=2)  # fmt: skip
    reference, parallel = _generate(tp_model, params, 1), _generate(tp_model, params, 2)
    for ref, got in zip(reference, parallel, strict=True):
        assert got.outputs[0].token_ids == ref.outputs[0].token_ids
        assert ref.prompt_logprobs and got.prompt_logprobs
        for a, b in zip(ref.prompt_logprobs, got.prompt_logprobs, strict=True):
            assert (a is None) == (b is None)
            if a is not None and b is not None:
                assert b.logprob == pytest.approx(a.logprob, abs=1e-4)


def test_default_model_is_refused_at_tp2(default_model: ResolvedModel) -> None:
    """SmolLM2-135M's 9 query heads and 3 KV heads do not split in two: refused before any
    worker starts, naming the numbers."""
    with pytest.raises(ValueError, match=r"num_heads \(9\), num_kv_heads \(3\)"):
        check_divisible(read_arch(default_model), 2)
    with pytest.raises(ValueError, match=r"tensor_parallel_size 2 must divide .*num_heads \(9\)"):
        LLM(str(default_model.path), tensor_parallel_size=2)
    check_divisible(read_arch(default_model), 3)  # 3 divides both (and the widths, the vocab)


def test_shards_reassemble(tp_model: Path) -> None:
    """The ranks' slices of each fused weight put back together are the whole weight."""
    arch = read_arch(ResolvedModel(name="tp", path=tp_model, format="hf"))
    local = shard_arch(arch, 2)
    assert (local.num_heads, local.num_kv_heads) == (arch.num_heads // 2, arch.num_kv_heads // 2)
    d, h, kv = arch.head_size, arch.num_heads, arch.num_kv_heads
    qkv = torch.randn((h + 2 * kv) * d, arch.hidden_size)
    parts = [shard_weight("layers.0.qkv_proj.weight", qkv, arch, r, 2) for r in range(2)]
    q, k, v = torch.split(qkv, [h * d, kv * d, kv * d])
    for rank, part in enumerate(parts):
        half = slice(rank * h * d // 2, (rank + 1) * h * d // 2)
        kv_half = slice(rank * kv * d // 2, (rank + 1) * kv * d // 2)
        assert torch.equal(part, torch.cat([q[half], k[kv_half], v[kv_half]]))
    down = torch.randn(arch.hidden_size, arch.intermediate_size)
    cols = [shard_weight("layers.0.mlp.down_proj.weight", down, arch, r, 2) for r in range(2)]
    assert torch.equal(torch.cat(cols, dim=1), down)
    with pytest.raises(ValueError, match=r"tensor_parallel_size 3 must divide"):
        shard_arch(arch, 3)


def test_worker_death_while_idle_is_reported(tp_model: Path) -> None:
    """The watchdog sees a worker exit between steps: the engine's fault callback fires at
    once, and the next step refuses with EngineDeadError instead of waiting on the lost rank."""
    llm = LLM(str(tp_model), tensor_parallel_size=2, **ENGINE)
    try:
        reasons: list[str] = []
        llm.engine.on_fault(reasons.append)
        tp = llm.engine.model_runner.tp
        assert tp is not None
        (worker,) = tp.processes
        worker.kill()
        deadline = time.monotonic() + 10
        while not reasons and time.monotonic() < deadline:
            time.sleep(0.05)
        assert reasons and "exited with code" in reasons[0], reasons
        with pytest.raises(EngineDeadError, match="exited with code"):
            llm.generate(PROMPTS[:1], SamplingParams(max_tokens=2))
    finally:
        llm.close()
    assert not worker.is_alive()


def test_bf16_ranks_run_native_kernels_per_layer(tp_model: Path) -> None:
    """At TP > 1 the layers run one by one (the one-call native decoder stack cannot stop for
    the all-reduce), each projection still on the packed native kernel where the CPU has it."""
    from pagedserve.core.models.linear.dense import PackableLinear
    from pagedserve.core.ops.linear import native_linear_available

    llm = LLM(str(tp_model), tensor_parallel_size=2, dtype="bfloat16", num_pages=64)
    try:
        model = llm.engine.model_runner.model
        assert model.stack is None
        linears = [m for m in model.modules() if isinstance(m, PackableLinear)]
        assert all(m.packed is not None for m in linears) == native_linear_available()
        out = llm.generate(
            PROMPTS[:2], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
        )
        assert all(len(o.outputs[0].token_ids) == 8 for o in out)
    finally:
        llm.close()
