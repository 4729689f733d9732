"""The measured dispatch between the native packed linear kernel and torch's matmul on CPU
(models/linear/dispatch.py): the decision on given timings, a real calibration, the forced and
the mixed paths against transformers' fp32 greedy tokens, and --deterministic keeping native;
the calibration and the forced paths at each native path's level (avx2, avx512, avx512_bf16; a
level the CPU lacks skips, saying so)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import torch

from pagedserve import LLM, SamplingParams
from pagedserve.core.config import ModelConfig
from pagedserve.core.models.linear import dense as linear_module
from pagedserve.core.models.linear import dispatch as linear_dispatch
from pagedserve.core.models.linear.dispatch import (
    DispatchInputs,
    Timing,
    layer_shapes,
    plan_dispatch,
    torch_from_rows,
)
from pagedserve.core.ops.cpu_features import cpu_features, cpu_isa
from pagedserve.core.ops.linear import native_linear_available

needs_native = pytest.mark.skipif(
    not native_linear_available(), reason="no native linear kernel below ISA level avx2"
)
NATIVE_ISAS = ("avx2", "avx512", "avx512_bf16")
each_native_path = pytest.mark.parametrize("cpu_isa", NATIVE_ISAS, indirect=True)
PATHS = {level: level for level in NATIVE_ISAS}
"""The native kernel's path at each of those levels (ops/linear.py's native_linear_path())."""
PROMPTS = ["the quick brown fox", "hello world, this is", "Once upon a time 42"]
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
AVX512_FLAGS = {"avx512f", "avx512bw", "avx512vl", "avx512dq"}


def timings(*rows_native_torch: tuple[int, float, float]) -> list[Timing]:
    return [Timing(r, n, t) for r, n, t in rows_native_torch]


def test_torch_from_rows_on_given_timings() -> None:
    assert torch_from_rows([]) is None
    # Native faster everywhere (Zen 4): never.
    assert torch_from_rows(timings((16, 1, 2), (64, 3, 4), (512, 20, 30))) is None
    # Torch faster from 64 rows on (an AMX CPU): from 64.
    assert torch_from_rows(timings((16, 1, 2), (64, 4, 1), (256, 16, 3), (512, 30, 5))) == 64
    # A win at 64 that does not hold at 512 is not taken; nor one inside the margin.
    assert torch_from_rows(timings((16, 1, 2), (64, 4, 1), (512, 30, 40))) is None
    assert torch_from_rows(timings((64, 1.0, 0.9), (512, 10.0, 8.5))) is None
    assert torch_from_rows(timings((64, 1.0, 0.9), (512, 10.0, 8.5)), margin=0.1) == 64
    # Unsorted input, torch everywhere: from the least row count.
    assert torch_from_rows(timings((512, 9, 1), (16, 2, 1))) == 16


def cpuinfo_is_another_cpus(flags: set[str]) -> bool:
    """Under qemu-user the kernel's /proc/cpuinfo is the host's while CPUID answers for the
    emulated CPU: torch's own CPUID reading (its capability, unless ATEN_CPU_CAPABILITY lowers
    it) then lacks the AVX-512 (F/BW/VL/DQ: torch's AVX512) that the file lists."""
    if os.environ.get("ATEN_CPU_CAPABILITY") or not AVX512_FLAGS <= flags:
        return False
    return not torch.backends.cpu.get_cpu_capability().startswith("AVX512")


def test_cpu_features_agree_with_proc_cpuinfo() -> None:
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.exists():
        pytest.skip("no /proc/cpuinfo")
    flags = set()
    for line in cpuinfo.read_text().splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    features = cpu_features()
    if not features.avx512f and cpuinfo_is_another_cpus(flags):
        pytest.skip(
            "/proc/cpuinfo lists AVX-512 that CPUID (ours and torch's) does not report: it "
            "describes the host, not the CPU this process runs on (a user-mode emulator such as "
            "qemu-x86_64 -cpu EPYC-Milan)"
        )
    for name in ("avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile", "amx_int8"):
        assert getattr(features, name) == (name in flags), name
    assert features.amx_permitted <= features.amx_tile
    assert ("no amx" in features.describe()) == (not features.amx_tile)


def test_calibration_rows_follow_the_token_budget() -> None:
    assert linear_dispatch.calibration_rows(512) == [16, 64, 256, 512]
    assert linear_dispatch.calibration_rows(16) == [16]
    assert linear_dispatch.calibration_rows(8192) == [16, 64, 256, 1024]
    assert linear_dispatch.calibration_rows(512, amx=True) == [1, 16, 64, 256, 512]


def test_config_checks_cpu_linear() -> None:
    with pytest.raises(ValueError, match="cpu_linear must be one of"):
        ModelConfig(cpu_linear="tiles")
    with pytest.raises(ValueError, match="cpu_linear 'torch' is not batch-invariant"):
        ModelConfig(cpu_linear="torch")
    assert ModelConfig(cpu_linear="torch", deterministic=False).cpu_linear == "torch"


@pytest.fixture(scope="module")
def oracle_tokens(tiny_model: Path) -> list[list[int]]:
    """transformers fp32 greedy tokens on the tiny model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    result = []
    for prompt in PROMPTS:
        ids = tokenizer(prompt)["input_ids"]
        with torch.no_grad():
            out = hf.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=24,
                              min_new_tokens=24, eos_token_id=None, pad_token_id=0)  # fmt: skip
        result.append(out[0, len(ids) :].tolist())
    return result


def run(folder: Path, **kwargs: object) -> tuple[LLM, list[list[int]]]:
    """The tiny model in fp32 (at the level the test forced: the engine would set its own)."""
    kwargs.setdefault("cpu_isa", cpu_isa())
    llm = LLM(str(folder), dtype="float32", num_pages=64, page_size=8,
              max_num_batched_tokens=16, **kwargs)  # fmt: skip
    return llm, [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)]


@pytest.mark.parametrize("cpu_isa", ("portable", *NATIVE_ISAS), indirect=True)
def test_real_calibration_on_tiny_model_is_logged(
    tiny_model: Path, caplog: pytest.LogCaptureFixture, cpu_isa: str
) -> None:
    caplog.set_level(logging.INFO, logger="pagedserve")
    llm = LLM(str(tiny_model), dtype="bfloat16", num_pages=64, page_size=8,
              max_num_batched_tokens=64, deterministic=False, cpu_isa=cpu_isa)  # fmt: skip
    try:
        weights = llm.engine.model_info.weights
        model = llm.engine.model_runner.model
    finally:
        llm.close()
    assert weights.startswith("bfloat16; linears: "), weights
    assert f"cpu: {cpu_features().describe()}" in weights
    if not native_linear_available():
        assert "no native kernel" in weights
        return
    assert f"native kernel {PATHS[cpu_isa]}" in weights
    assert "linear calibration" in caplog.text
    for rows in (16, 64):
        assert f"{rows} rows " in caplog.text  # both row counts measured, in ms
    # Whatever the load made of it, the decision is one the rule allows, and applied.
    assert model.torch_from in (None, 16, 64)
    assert ("torch from" in weights) == (model.torch_from is not None)


@each_native_path
@pytest.mark.parametrize("path", ["native", "torch"])
def test_forced_path_gives_the_oracle_tokens(
    tiny_model: Path,
    oracle_tokens: list[list[int]],
    path: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    cpu_isa: str,
) -> None:
    calls = count_products(monkeypatch)
    caplog.set_level(logging.INFO, logger="pagedserve")
    llm, ours = run(tiny_model, cpu_linear=path, deterministic=path == "native")
    model, info = llm.engine.model_runner.model, llm.engine.model_info
    llm.close()
    assert ours == oracle_tokens
    assert f"native kernel {PATHS[cpu_isa]}" in info.weights
    other = "native" if path == "torch" else "torch"
    steps = model.linear_steps[path]
    assert steps > 0 and model.linear_steps[other] == 0
    products = 4 * len(model.layers) * steps  # qkv, o, gate_up, down per layer and step
    if path == "torch":  # every layer's products on torch, lm_head's (one a step) native
        assert (len(calls["torch"]), len(calls["native"])) == (products, steps)
    else:
        assert (len(calls["torch"]), len(calls["native"])) == (0, products + steps)
    qkv = model.layers[0].qkv_proj
    assert qkv.packed is not None  # the native kernel stays for lm_head and fewer rows
    assert ("torch from 1 rows" in repr(qkv)) == (path == "torch")
    assert (qkv.weight is not None) == (path == "torch")  # kept only where torch runs
    assert ("the unpacked weights kept for torch take" in caplog.text) == (path == "torch")
    assert model.lm_head.torch_from is None


def prefer_torch(monkeypatch: pytest.MonkeyPatch, from_rows: int) -> list[list[int]]:
    """Calibration timings where torch is 4x faster from `from_rows` rows on; returns the row
    counts each calibration was asked for."""
    asked: list[list[int]] = []

    def measure(shapes, rows, dtype, threads, amx=False):
        asked.append(list(rows))
        return [Timing(r, 4.0, 1.0 if r >= from_rows else 8.0) for r in rows]

    monkeypatch.setattr(linear_dispatch, "measure_layer", measure)
    return asked


@needs_native
def test_mixed_run_routes_big_steps_to_torch(
    tiny_model: Path, oracle_tokens: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    asked = prefer_torch(monkeypatch, from_rows=8)
    monkeypatch.setattr(linear_dispatch, "ROWS", (4, 8))
    calls = count_products(monkeypatch)
    llm, ours = run(tiny_model, deterministic=False)
    model, info = llm.engine.model_runner.model, llm.engine.model_info
    llm.close()
    assert asked == [[4, 8, 16]]
    assert model.torch_from == 8 and "native below 8 rows, torch from 8" in info.weights
    assert not info.batch_invariant
    # Prefill chunks (>= 8 tokens) ran torch, the 3-row decode steps the native kernel.
    assert model.linear_steps["torch"] > 0 and model.linear_steps["native"] > 0
    assert calls["torch"] and min(calls["torch"]) >= 8
    assert calls["native"] and max(calls["native"]) < 8  # decode steps, and lm_head's rows
    assert ours == oracle_tokens


def count_products(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[int]]:
    """From now on, the row count of every linear product the layers run, by path."""
    calls: dict[str, list[int]] = {"native": [], "torch": []}
    for owner, name, path in ((linear_module, "packed_linear", "native"),
                              (linear_module, "packed_gated_linear", "native"),
                              (torch.nn.functional, "linear", "torch"),
                              (torch, "addmm", "torch")):  # fmt: skip
        monkeypatch.setattr(owner, name, counting(getattr(owner, name), calls[path], path))
    return calls


def counting(fn, rows: list[int], path: str):
    """fn, recording the rows of x (a native op's second argument, torch's first or second)."""

    def wrapper(*args, **kwargs):
        x = args[1] if path == "native" or fn is torch.addmm else args[0]
        rows.append(x.shape[0])
        return fn(*args, **kwargs)

    return wrapper


@needs_native
def test_deterministic_keeps_native_when_torch_is_faster(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefer_torch(monkeypatch, from_rows=1)
    llm, _ = run(tiny_model)  # --deterministic is the default
    model, info = llm.engine.model_runner.model, llm.engine.model_info
    llm.close()
    assert model.torch_from is None and model.linear_steps["torch"] == 0
    assert "deterministic; torch would be up to 4.00x faster from 16 rows" in info.weights
    assert info.batch_invariant
    assert model.layers[0].qkv_proj.weight is None  # no unpacked copy kept


def test_quantized_or_expert_models_stay_native(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pagedserve.core.models.registry import read_arch
    from pagedserve.core.models.resolve import resolve_model

    arch = read_arch(resolve_model(str(tiny_model)))
    monkeypatch.setattr(linear_dispatch, "measure_layer", lambda *a: pytest.fail("measured"))
    for inputs, why in (
        (DispatchInputs(arch, torch.bfloat16, 512, quantized=True), "quantized kernels"),
        (DispatchInputs(arch, torch.bfloat16, 512, dense=False), "experts"),
        (DispatchInputs(arch, torch.bfloat16, 512, tensor_parallel=True), "tensor parallel"),
    ):
        if why != "quantized kernels" and not native_linear_available():
            why = "no native kernel"  # dense layers stay on torch where no native kernel runs
        dispatch = plan_dispatch("auto", False, inputs)
        assert dispatch.torch_from is None and why in dispatch.summary
        assert plan_dispatch("torch", False, inputs).torch_from is None
    assert [s.name for s in layer_shapes(arch)] == ["qkv", "o", "gate_up", "down"]
