"""The native kernels' AMX tiles as the engine uses them (cpp/src/linear/amx.hpp,
linear_quant/amx.hpp, models/linear/dispatch.py): the bf16 choice on given timings, with
--deterministic and without; the bf16 op on tiles against its AVX512-BF16 path; a whole engine
on tiles (cpu_linear amx); the quantized kernel on AMX-INT8 tiles giving the VNNI path's bits,
in the op and in the decoder stack, and its start-up choice. On a CPU without AMX the tiles are
the kernels' software emulation of the SDM's pseudo-code (same blocking, tails and epilogue);
where the CPU has AMX the op tests run on its tiles too. Below ISA level avx512_bf16 (an AVX2-only
CPU) the tile tests skip and the dispatch's rules on given timings still run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType as Q

from bench.common.tiny_models import write_gguf_model
from pagedserve import LLM, SamplingParams
from pagedserve.core.attention.native import NativeAttentionBackend
from pagedserve.core.device_policy import is_batch_invariant
from pagedserve.core.models import load_model
from pagedserve.core.models.arch import ArchConfig
from pagedserve.core.models.linear import dispatch as linear_dispatch
from pagedserve.core.models.linear.dispatch import (
    DispatchInputs,
    Timing,
    amx_from_rows,
    plan_dispatch,
    quantized_amx_choice,
    tiles_agree_with_avx512,
)
from pagedserve.core.models.registry import read_arch
from pagedserve.core.models.resolve import resolve_model
from pagedserve.core.ops.cpu_features import isa_at_least
from pagedserve.core.ops.linear import (
    amx_available,
    pack_gated_weight,
    pack_weight,
    packed_gated_linear,
    packed_linear,
)
from pagedserve.core.ops.linear_quant import pack_quant_weight, quant_amx_available, quant_linear
from pagedserve.core.ops.native import core
from tests.core.models.test_decoder_stack import hidden_states
from tests.quant_blocks import gguf_rows, row_addresses

HARDWARE = amx_available()  # before any test turns the emulation on
QUANT_HARDWARE = quant_amx_available()
PROMPTS = ["the quick brown fox", "hello world, this is", "Once upon a time 42"]
GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)


def needs_bf16_kernel() -> None:
    """The tests that run tiles skip below ISA level avx512_bf16 (the dispatch's rules on given
    timings run everywhere)."""
    if not isa_at_least("avx512_bf16"):
        pytest.skip(
            "the AMX paths, emulated ones too, run on the AVX512-BF16 kernel (ISA level avx512_bf16)"
        )


@pytest.fixture
def emulated() -> Iterator[None]:
    needs_bf16_kernel()
    core.linear_amx_emulation(True)
    tiles_agree_with_avx512.cache_clear()
    try:
        yield
    finally:
        core.linear_amx_emulation(False)
        tiles_agree_with_avx512.cache_clear()


@pytest.fixture(params=["emulated", "hardware"])
def tiles(request: pytest.FixtureRequest) -> Iterator[str]:
    """Each kind of tile this machine has: the emulation everywhere, the CPU's own with AMX."""
    needs_bf16_kernel()
    if request.param == "hardware":
        if not HARDWARE:
            pytest.skip("this CPU has no AMX-BF16 tiles (or Linux did not grant them)")
        yield "hardware"
        return
    core.linear_amx_emulation(True)
    try:
        yield "emulated"
    finally:
        core.linear_amx_emulation(False)


@pytest.fixture(scope="module")
def arch(tiny_model: Path) -> ArchConfig:
    return read_arch(resolve_model(str(tiny_model)))


def test_amx_from_rows_on_given_timings() -> None:
    def t(rows: int, native: float, amx: float | None) -> Timing:
        return Timing(rows, native, 100.0, amx)

    assert amx_from_rows([t(16, 1, None), t(64, 4, None)]) is None  # not measured
    assert amx_from_rows([t(1, 1, 2), t(16, 2, 1.5), t(64, 4, 1)]) == 16
    assert amx_from_rows([t(1, 1, 2), t(16, 2, 1.9), t(64, 4, 1)]) == 64  # inside the margin
    assert amx_from_rows([t(1, 1, 0.5), t(64, 4, 1)]) == 1
    assert amx_from_rows([t(64, 4, 1), t(256, 8, 9)]) is None  # must hold up to the largest
    # torch is measured against the faster native path.
    assert Timing(64, 4.0, 2.0, 1.0).torch_speedup == 0.5


def _dispatch(
    monkeypatch: pytest.MonkeyPatch,
    arch: ArchConfig,
    deterministic: bool,
    one_row_amx_s: float,
    agrees: tuple[bool, ...] = (),
    one_row_tile_order_s: float = 3.0,
) -> linear_dispatch.LinearDispatch:
    """plan_dispatch on timings where the tiles are 3x faster than AVX512-BF16 from 64 rows
    (4/3 slower below), AVX-512 in the tiles' order twice as slow as AVX512-BF16 from 16 rows,
    torch never; `agrees`: the orders (False: AVX512-BF16's, True: the tiles') whose rows the
    CPU's tiles give bit for bit."""

    def measure(shapes, rows, dtype, threads, amx):
        assert amx and 1 in rows
        return [
            Timing(
                r,
                3.0 * r,
                10.0 * r,
                one_row_amx_s if r == 1 else (1.0 if r >= 64 else 4.0) * r,
                one_row_tile_order_s if r == 1 else 6.0 * r,
            )  # fmt: skip
            for r in rows
        ]

    monkeypatch.setattr(linear_dispatch, "measure_layer", measure)
    monkeypatch.setattr(linear_dispatch, "amx_available", lambda: True)
    monkeypatch.setattr(
        linear_dispatch, "tiles_agree_with_avx512", lambda tile_order=False: tile_order in agrees
    )
    return plan_dispatch("auto", deterministic, DispatchInputs(arch, torch.bfloat16, 256))


def test_amx_choice_with_and_without_determinism(
    monkeypatch: pytest.MonkeyPatch, arch: ArchConfig
) -> None:
    fast, slow = 2.9, 4.0  # one row on tiles (or in their order) vs AVX512-BF16's 3.0
    free = _dispatch(monkeypatch, arch, False, slow)
    assert free.amx_from == 64 and not free.amx_tile_order
    assert "AMX tiles from 64 rows (up to 3.00x" in free.summary
    # Deterministic: a threshold where the tiles round as AVX512-BF16 ...
    plain = _dispatch(monkeypatch, arch, True, slow, agrees=(False,))
    assert (plain.amx_from, plain.amx_tile_order) == (64, False)
    # ... or as AVX-512 summing in their order, cheap at one row: the rows below it take that
    # order, and the tiles beat it from 16 rows (4 vs 6 per row) ...
    ordered = _dispatch(monkeypatch, arch, True, slow, agrees=(True,))
    assert (ordered.amx_from, ordered.amx_tile_order) == (16, True)
    assert "fewer rows summed in the tiles' order" in ordered.summary
    # ... else every call on tiles where one row pays no more than the slack ...
    every = _dispatch(monkeypatch, arch, True, fast, agrees=(True,), one_row_tile_order_s=slow)
    assert (every.amx_from, every.amx_tile_order) == (1, False)
    assert "AMX tiles at every row count (deterministic" in every.summary
    # ... or none, saying what --no-deterministic would take.
    none = _dispatch(monkeypatch, arch, True, slow)
    assert none.amx_from == 0
    assert "AMX tiles would be up to 3.00x faster from 64 rows" in none.summary
    assert none.torch_from is None and free.torch_from is None


def test_cpu_linear_amx_needs_tiles(monkeypatch: pytest.MonkeyPatch, arch: ArchConfig) -> None:
    monkeypatch.setattr(linear_dispatch, "amx_available", lambda: False)
    with pytest.raises(ValueError, match="cpu_linear 'amx' needs bfloat16 weights and a CPU"):
        plan_dispatch("amx", True, DispatchInputs(arch, torch.bfloat16, 256))
    monkeypatch.setattr(linear_dispatch, "amx_available", lambda: True)
    with pytest.raises(ValueError, match="cpu_linear 'amx' needs bfloat16"):
        plan_dispatch("amx", True, DispatchInputs(arch, torch.float32, 256))
    assert plan_dispatch("amx", True, DispatchInputs(arch, torch.bfloat16, 256)).amx_from == 1


def test_packed_linear_on_tiles_against_avx512(tiles: str) -> None:
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(45, 200, generator=gen).to(torch.bfloat16)  # a 32- and a 13-row block
    weight = torch.randn(70, 200, generator=gen).to(torch.bfloat16)  # k: 6 steps + 8 features
    bias = torch.randn(70, generator=gen).to(torch.bfloat16)
    packed = pack_weight(weight)
    want = x.float() @ weight.float().t() + bias.float()
    outs = {}
    for amx_from in (0, 1, 46):
        before = core.linear_amx_items()
        outs[amx_from] = torch.empty(45, 70)
        packed_linear(outs[amx_from], x, packed, bias, None, amx_from)
        assert (core.linear_amx_items() > before) == (amx_from == 1)
    torch.testing.assert_close(outs[1], want, rtol=1e-4, atol=1e-3)
    assert torch.equal(outs[46], outs[0])  # 45 rows < 46: the AVX512-BF16 path
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-5)
    # Gated, bf16 out: silu(gate) * up.
    gate_up = torch.randn(2 * 40, 200, generator=gen).to(torch.bfloat16)
    out = torch.empty(45, 40, dtype=torch.bfloat16)
    packed_gated_linear(out, x, pack_gated_weight(gate_up, 40), 1)
    both = x.float() @ gate_up.float().t()
    want = torch.nn.functional.silu(both[:, :40]) * both[:, 40:]
    torch.testing.assert_close(out.float(), want, rtol=2e-2, atol=2e-2)
    with pytest.raises(ValueError, match="amx_from_rows must be >= 0"):
        packed_linear(outs[0], x, packed, bias, None, -1)


def test_emulated_tiles_round_as_the_tile_order_not_as_avx512(emulated: None) -> None:
    """The SDM's TDPBF16PS adds a pair's products even feature first, VDPBF16PS odd first:
    the probe that lets --deterministic keep a threshold says no for AVX512-BF16's order and
    yes for the tiles' order on AVX-512 (fp32 FMAs, even first, denormals flushed)."""
    assert amx_available() and not tiles_agree_with_avx512()
    assert tiles_agree_with_avx512(True)


def test_engine_on_tiles_is_batch_invariant(emulated: None, tiny_model: Path) -> None:
    """cpu_linear amx: every bf16 product (the decoder stack's, lm_head's) on tiles, each
    prompt's greedy tokens the same alone as in a batch. Then a threshold of 8 rows with the
    rows below it in the tiles' order: the very same tokens (the two paths agree bit for bit)."""
    llm = LLM(str(tiny_model), dtype="bfloat16", cpu_linear="amx", num_pages=64, page_size=8,
              max_num_batched_tokens=32)  # fmt: skip
    try:
        model, info = llm.engine.model_runner.model, llm.engine.model_info
        assert model.amx_from == 1 and model.lm_head.amx_from == 1
        assert model.stack is not None and model.stack.amx_from_rows == 1
        assert "native on AMX tiles at every row count" in info.weights
        assert info.batch_invariant
        before = core.linear_amx_items()
        batched = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)]
        assert core.linear_amx_items() > before
        alone = [llm.generate([p], GREEDY)[0].outputs[0].token_ids for p in PROMPTS]
        model.use_amx(8, tile_order=True)
        assert model.stack.amx_tile_order and model.layers[0].qkv_proj.tile_order
        assert is_batch_invariant(model, model.layers[0].attention, torch.device("cpu"))
        mixed = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)]
    finally:
        llm.close()
    assert batched == alone == mixed


@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q8_0, Q.Q6_K])
def test_quant_linear_on_tiles_is_the_vnni_path_bit_for_bit(tiles: str, qtype: Q) -> None:
    if tiles == "hardware" and not QUANT_HARDWARE:
        pytest.skip("this CPU has no AMX-INT8 tiles (or Linux did not grant them)")
    n, k = 70, 256
    rows = gguf_rows(qtype, n, k, seed=2)
    packed = pack_quant_weight(int(qtype), row_addresses(rows), k)
    x = torch.randn(45, k, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    outs = []
    for amx_from in (0, 1):
        before = core.linear_amx_items()
        out = torch.empty(45, n)
        quant_linear(out, x, packed, int(qtype), None, None, 0, amx_from)
        assert (core.linear_amx_items() > before) == (amx_from == 1)
        outs.append(out)
    assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q8_0, Q.Q6_K])
def test_int16_rows_on_tiles_are_the_vnni_path_bit_for_bit(tiles: str, qtype: Q) -> None:
    """int16 rows (two int8 parts) take AMX-INT8 tiles from the threshold, two tile products a
    group folded as 255 hi + lo: the VNNI path's bits (45 rows: two A tiles, the second
    partial)."""
    if tiles == "hardware" and not QUANT_HARDWARE:
        pytest.skip("this CPU has no AMX-INT8 tiles (or Linux did not grant them)")
    n, k, m = 70, 256, 45
    rows = gguf_rows(qtype, n, k, seed=4)  # alive while the packing reads its addresses
    packed = pack_quant_weight(int(qtype), row_addresses(rows), k)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    outs = []
    for amx_from in (0, 1):
        before = core.linear_amx_items()
        out = torch.empty(m, n)
        core.quant_linear(int(qtype), x.data_ptr(), k, False, packed.data_ptr(), 0, 0, 0,
                          out.data_ptr(), n, True, m, n, k, 0, 2, False, False, amx_from,
                          False, True)  # fmt: skip
        assert (core.linear_amx_items() > before) == (amx_from == 1)
        outs.append(out)
    assert torch.equal(outs[0], outs[1])


def test_stack_runs_quantized_projections_on_tiles(emulated: None, tmp_path: Path) -> None:
    """bf16 with the native attention: the decoder stack passes the int8 threshold to every
    quantized projection; the hidden states are the VNNI run's bit for bit."""
    path = tmp_path / "m.gguf"
    write_gguf_model(path, "llama", qtype="Q4_1")
    model, arch = load_model(resolve_model(str(path)), dtype=torch.bfloat16,
                             device=torch.device("cpu"), attention=NativeAttentionBackend(),
                             progress=False, quantization="auto")  # fmt: skip
    assert model.stack is not None
    vnni = hidden_states(model, arch)
    model.use_amx(0, 1)
    assert model.stack.amx_int8_from_rows == 1 and model.layers[0].qkv_proj.amx_from == 1
    before = core.linear_amx_items()
    tiles = hidden_states(model, arch)
    assert core.linear_amx_items() > before
    for got, want in zip(tiles, vnni, strict=True):
        assert torch.equal(got, want)
    # The start-up choice measures the layer's own projections; emulated tiles are slow, so
    # they are not taken, and the summary says so.
    start, note = quantized_amx_choice(list(model.layers[0].modules()), [16, 64], torch.bfloat16)
    assert start == 0 and note.startswith("AMX-INT8 tiles not taken (at best")
    assert all(m.amx_from == 0 for m in model.layers[0].modules() if hasattr(m, "amx_from"))
    assert quantized_amx_choice([], [16], torch.bfloat16) == (0, "")
