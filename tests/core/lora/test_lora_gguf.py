"""GGUF LoRA files (llama.cpp's convert_lora_to_gguf.py) against their PEFT folders: the same
AdapterWeights (f32 exactly; f16, bf16, q8_0 within their rounding), transformers + PEFT's
greedy tokens alone and in a batch mixing GGUF and PEFT adapters and the base, on an HF base and
on a Q8_0 GGUF base kept quantized; each refusal a LoRAError naming it, the engine unchanged;
llama.cpp's own converter, where it is unpacked, read into the PEFT folder's weights (the other
families' files too, marked slow: `pytest -m slow tests/core/lora/test_lora_gguf.py`)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from bench.common.tiny_lora import ATTENTION, MLP, write_peft_adapter
from bench.common.tiny_models import make_hf_model, write_gguf_llama
from bench.common.tiny_tokenizers import write_tiny_spm
from pagedserve import LLM
from pagedserve.core.lora.gguf import LLAMA_CPP_ARCHITECTURES, LoraBase, read_gguf_lora
from pagedserve.core.lora.peft import AdapterWeights, read_peft
from pagedserve.core.lora.registry import read_adapter
from pagedserve.core.lora_request import LoRAError, LoRARequest
from pagedserve.core.models.families import FAMILIES
from pagedserve.core.models.loader_gguf import GGUF_ARCHITECTURES
from tests.core.lora.gguf_lora import converted, gguf_from_peft, write_gguf_lora
from tests.core.lora.oracle import GREEDY, PROMPTS, QuantizedBase, ours, request

TINY = LoraBase("llama", num_heads=4, num_kv_heads=2)  # bench/common/tiny_models.py's shape
WORK = Path(__file__).resolve().parents[3] / "bench" / ".work"
CONVERTERS = sorted(WORK.glob("llama_cpp_python-*/vendor/llama.cpp/convert_lora_to_gguf.py"))


def assert_same(got: AdapterWeights, want: AdapterWeights, atol: float = 0.0) -> None:
    assert got.rank == want.rank and sorted(got.modules) == sorted(want.modules)
    for key, (a, b, scaling) in want.modules.items():
        a2, b2, scaling2 = got.modules[key]
        assert scaling2 == scaling, key
        for got_t, want_t in ((a2, a), (b2, b)):
            assert got_t.dtype == torch.float32 and got_t.shape == want_t.shape, key
            assert (got_t - want_t).abs().max().item() <= atol, key


@pytest.mark.parametrize("name", ["attn", "all"])
def test_a_gguf_adapter_holds_its_peft_folders_weights(
    model: tuple[Path, dict[str, Path]], gguf_adapters: dict[str, Path], name: str
) -> None:
    _, adapters = model
    want = read_peft(adapters[name])
    assert_same(read_gguf_lora(gguf_adapters[name], TINY), want)
    assert_same(read_adapter(str(gguf_adapters[name]), TINY), want)  # the registry's dispatch
    stored = converted(adapters[name], "llama", num_heads=4, num_kv_heads=2)
    q_b = stored["blk.0.attn_q.weight.lora_b"]  # stored permuted: read back in HF's order
    assert not np.array_equal(q_b, want.modules[(0, "q_proj")][1].numpy())


@pytest.mark.parametrize(("qtype", "atol"), [("F16", 1e-4), ("BF16", 1e-3), ("Q8_0", 2e-3)])
def test_f16_bf16_and_q8_0_files_dequantize(
    model: tuple[Path, dict[str, Path]], tmp_path: Path, qtype: str, atol: float
) -> None:
    """The converter's other --outtype choices (q8_0's B of rank 16 falls back to F16)."""
    _, adapters = model
    path = gguf_from_peft(adapters["all"], tmp_path / "all.gguf", alpha=16.0, qtype=qtype)
    assert_same(read_gguf_lora(path, TINY), read_peft(adapters["all"]), atol=atol)


def test_alpha_zero_or_missing_means_no_scaling(
    model: tuple[Path, dict[str, Path]], tmp_path: Path
) -> None:
    """llama.cpp's rule (llama_adapter_lora_weight::get_scale): scale alpha / r, or 1 when the
    file's alpha is 0 (a missing key reads as 0)."""
    tensors = converted(model[1]["attn"], "llama", num_heads=4, num_kv_heads=2)
    for alpha in (0.0, None):
        path = write_gguf_lora(tmp_path / f"{alpha}.gguf", tensors, alpha=alpha)
        assert {s for _, _, s in read_gguf_lora(path, TINY).modules.values()} == {1.0}


def test_gguf_adapters_alone_and_mixed_with_peft_and_the_base(
    model: tuple[Path, dict[str, Path]],
    gguf_adapters: dict[str, Path],
    llm: LLM,
    oracle: dict[str | None, list[list[int]]],
) -> None:
    _, adapters = model
    files = {f"{name}.gguf": path for name, path in gguf_adapters.items()}
    assert ours(llm, [request(files, "attn.gguf")] * len(PROMPTS)) == oracle["attn"]
    # each step mixes two GGUF adapters, a PEFT one and the base
    names = ["all.gguf", "mlp", "attn.gguf", None]
    loras = [request({**files, **adapters}, n) if n else None for n in names for _ in PROMPTS]
    want = [t for n in names for t in oracle[n.removesuffix(".gguf") if n else None]]
    assert ours(llm, loras) == want


def test_a_gguf_adapter_on_a_quantized_gguf_base(quantized: QuantizedBase, tmp_path: Path) -> None:
    """The Q8_0 base kept quantized, the adapter read from GGUF: PEFT's tokens on
    transformers' dequantized copy (q/k's B unpermuted with the GGUF's own head counts)."""
    path = gguf_from_peft(quantized.adapter, tmp_path / "q8.gguf", alpha=16.0)
    outputs = quantized.llm.generate(PROMPTS, GREEDY, lora_request=LoRARequest("q8.gguf", 0,
                                                                               str(path)))  # fmt: skip
    assert [list(o.outputs[0].token_ids) for o in outputs] == quantized.want


def _drop(name: str) -> Callable[[dict[str, np.ndarray]], None]:
    def drop(tensors: dict[str, np.ndarray]) -> None:
        del tensors[name]

    return drop


def _add(name: str, shape: tuple[int, ...]) -> Callable[[dict[str, np.ndarray]], None]:
    return lambda tensors: tensors.update({name: np.ones(shape, dtype=np.float32)})


BROKEN: dict[str, tuple[Callable[[dict[str, np.ndarray]], None], dict[str, object], str]] = {
    # case -> (change to the tensors, metadata replaced, what the message names)
    "model": (lambda t: None, {"general.type": "model"}, "not a LoRA adapter"),
    "control-vector": (lambda t: None, {"adapter.type": "control_vector"}, "adapter.type"),
    "alora": (lambda t: None, {"adapter.alora.invocation_tokens": [5, 6]}, "activated LoRA"),
    "qwen2": (lambda t: None, {"general.architecture": "qwen2"}, "'qwen2'"),
    "token_embd": (_add("token_embd.weight.lora_a", (8, 64)), {}, "token_embd.weight"),
    "output": (_add("output.weight.lora_b", (400, 8)), {}, "output.weight"),
    "norm": (_add("blk.0.attn_norm.weight", (64,)), {}, "blk.0.attn_norm.weight"),
    "experts": (_add("blk.0.ffn_gate_exps.weight.lora_a", (4, 8, 64)), {}, "ffn_gate_exps"),
    "half": (_drop("blk.1.attn_v.weight.lora_b"), {}, "lora_a and lora_b must both"),
    "ranks": (_add("blk.1.attn_v.weight.lora_b", (32, 4)), {}, "are not [r, in] and [out, r]"),
}


@pytest.mark.parametrize("case", BROKEN)
def test_each_refusal_names_what_is_wrong_and_changes_nothing(
    model: tuple[Path, dict[str, Path]], llm: LLM, tmp_path: Path, case: str
) -> None:
    change, fields, named = BROKEN[case][0], dict(BROKEN[case][1]), BROKEN[case][2]
    tensors = converted(model[1]["attn"], "llama", num_heads=4, num_kv_heads=2)
    change(tensors)
    arch = str(fields.pop("general.architecture", "llama"))
    path = write_gguf_lora(tmp_path / "bad.gguf", tensors, arch=arch, fields=fields)
    loaded = llm.engine.list_loras()
    with pytest.raises(LoRAError, match=named.replace("[", r"\[").replace("(", r"\(")):
        llm.engine.add_lora(case, str(path))
    assert llm.engine.list_loras() == loaded


def test_a_model_gguf_and_paths_of_neither_kind_are_refused(tmp_path: Path) -> None:
    write_gguf_llama(tmp_path / "model.gguf", seed=1)
    with pytest.raises(LoRAError, match="general.type is missing.*not a LoRA adapter"):
        read_adapter(str(tmp_path / "model.gguf"), TINY)
    (tmp_path / "garbage.gguf").write_bytes(b"not a gguf" * 10)
    with pytest.raises(LoRAError, match="not a readable GGUF file"):
        read_adapter(str(tmp_path / "garbage.gguf"), TINY)
    with pytest.raises(LoRAError, match="is not a file"):
        read_adapter(str(tmp_path / "missing.gguf"), TINY)
    (tmp_path / "adapter.bin").write_bytes(b"\0")
    with pytest.raises(LoRAError, match="neither a folder .* nor a .gguf file"):
        read_adapter(str(tmp_path / "adapter.bin"), TINY)


def test_every_family_names_its_llama_cpp_architecture() -> None:
    """The family -> llama.cpp name table agrees with the GGUF loader's table the other way."""
    assert set(LLAMA_CPP_ARCHITECTURES) == set(FAMILIES)
    # Qwen2(.5)-VL's language model file loads as qwen2 alone (qwen2_5_vl with --mmproj), whose
    # own files llama.cpp names qwen2: the one GGUF name of a family that is not its own.
    other_names = {("qwen2vl", "qwen2")}
    for gguf_arch, family in GGUF_ARCHITECTURES.items():
        if (gguf_arch, family) not in other_names:
            assert LLAMA_CPP_ARCHITECTURES[family] == gguf_arch, family


NEEDS_CONVERTER = pytest.mark.skipif(
    not CONVERTERS,
    reason="llama.cpp's converter is not unpacked: run bench/serving/build_llama_cpp.sh",
)


def convert(base: Path, adapter: Path, out: Path) -> Path:
    """convert_lora_to_gguf.py --base <HF folder> --outtype f32 (about 10 s: it imports
    transformers), run with its own gguf-py."""
    env = {**os.environ, "PYTHONPATH": str(CONVERTERS[-1].parent / "gguf-py")}
    cmd = [sys.executable, str(CONVERTERS[-1]), "--base", str(base), "--outtype", "f32",
           "--outfile", str(out), str(adapter)]  # fmt: skip
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@NEEDS_CONVERTER
def test_llama_cpp_converter_output_reads_as_the_peft_folder(
    model: tuple[Path, dict[str, Path]], tmp_path: Path
) -> None:
    folder, adapters = model
    out = convert(folder, adapters["all"], tmp_path / "all.gguf")
    assert_same(read_gguf_lora(out, TINY), read_peft(adapters["all"]))


@pytest.mark.slow
@NEEDS_CONVERTER
@pytest.mark.parametrize(
    "family",
    ["mistral", "mixtral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "gemma2", "gemma3_text"],
)
def test_llama_cpp_converter_output_of_the_other_families(tmp_path: Path, family: str) -> None:
    """Each family's file names its llama.cpp architecture (LLAMA_CPP_ARCHITECTURES) and reads
    as the PEFT folder (MoE families: attention only, adapters take no experts)."""
    folder = tmp_path / "hf"
    write_tiny_spm(folder)
    source = make_hf_model(family, seed=5, vocab_size=500)
    source.save_pretrained(folder)
    moe = family in ("mixtral", "qwen2_moe", "qwen3_moe")
    targets = ATTENTION if moe else ATTENTION + MLP
    adapter = write_peft_adapter(source, tmp_path / "peft", r=8, targets=targets, seed=2)
    out = convert(folder, adapter, tmp_path / "adapter.gguf")
    config = source.config
    base = LoraBase(family, config.num_attention_heads, config.num_key_value_heads)
    assert_same(read_gguf_lora(out, base), read_peft(adapter))
