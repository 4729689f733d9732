"""Fixtures shared by the whole suite."""

from __future__ import annotations

import os

# Idle OpenMP threads sleep at once instead of spinning (libgomp reads this when torch or _core
# first loads it: before the imports below; servers, ctest and qemu runs inherit it). The suite
# runs a test process beside servers, compilers and emulators on 2 cores, so a spinning team
# waits on a thread that is not running; decode of 48 tokens took 56-125 s that way on this busy
# 2-core Zen 3, 5.6-7.3 s with PASSIVE (the same tokens). Results do not depend on it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from pagedserve.core.models.resolve import ResolvedModel, resolve_model
from pagedserve.core.ops.cpu_features import (
    CPU_ISAS,
    cpu_isa_supported,
    forced_cpu_isa,
    runnable_isas,
)
from tests.hf_gguf import fast_gguf_parsing


def pytest_configure(config: pytest.Config) -> None:
    torch.set_num_threads(2)  # CI has 2 cores; more threads only oversubscribe
    root = Path(__file__).resolve().parents[1]
    gone = [module for module in FIRST if not (root / module).is_file()]
    if gone:  # a renamed module would silently lose its place at the front
        raise pytest.UsageError(f"tests/conftest.py's FIRST names modules that are gone: {gone}")


FIRST = (
    "tests/native/test_cpp_sanitized.py",
    "tests/native/test_cpp_x86_64_qemu.py",
    "tests/native/test_cpp_aarch64.py",
)
"""The longest modules (C++ builds, runs under sanitizers and under qemu: about a third of the
suite's time), collected first, in this order: pytest-xdist's two workers (addopts' -n 2) take
the first tests in one batch, so one worker builds and emulates while the other runs the Python
tests, rather than both meeting the builds at the end."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        module = item.nodeid.split("::")[0]
        return FIRST.index(module) if module in FIRST else len(FIRST)

    items.sort(key=rank)  # stable: every module's tests stay together, in their order
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


INT8_ONLY_ISAS = ("avx2_vnni", "neon_dotprod", "neon_i8mm")
KERNEL_ISAS = tuple(level for level in CPU_ISAS if level not in INT8_ONLY_ISAS)
"""The levels the cpu_isa fixture runs by default: avx2_vnni (on x86) and neon_dotprod,
neon_i8mm (on ARM) change only the int8 linear kernel (every other family runs there as at avx2
or neon), so the tests of that kernel and of the engine's tokens ask for them with
@pytest.mark.parametrize("cpu_isa", CPU_ISAS, indirect=True)."""


@pytest.fixture(params=KERNEL_ISAS)
def cpu_isa(request: pytest.FixtureRequest) -> Iterator[str]:
    """The test once per ISA level of the native kernels (each forced for its duration); the
    levels this CPU cannot run skip, saying so."""
    level = str(request.param)
    if level == "avx2_vnni" and level not in runnable_isas():
        pytest.skip("this CPU has no AVX-VNNI (avx2_vnni would run as avx2)")
    if level not in runnable_isas():
        pytest.skip(f"this CPU runs ISA levels up to {cpu_isa_supported()}, not {level}")
    with forced_cpu_isa(level):
        yield level


@pytest.fixture(scope="session")
def default_model_dir(request: pytest.FixtureRequest) -> Path:
    """Where the bundled default GGUF is cached between runs (pytest's cache folder)."""
    return Path(request.config.cache.mkdir("pagedserve-models"))


@pytest.fixture(scope="session")
def default_model(default_model_dir: Path) -> ResolvedModel:
    """The bundled default model (SmolLM2-135M-Instruct Q4_1 GGUF), fetched once."""
    return resolve_model("", cache_dir=default_model_dir)


@pytest.fixture(scope="session")
def hf_default_model(default_model: ResolvedModel) -> Any:
    """The oracle: transformers' own load of the same GGUF, in fp32 (loaded once)."""
    from transformers import AutoModelForCausalLM

    with fast_gguf_parsing():
        model = AutoModelForCausalLM.from_pretrained(
            default_model.path.parent, gguf_file=default_model.path.name, dtype=torch.float32
        ).eval()
    model.generation_config.eos_token_id = None  # always generate the full length
    return model


@pytest.fixture(scope="session")
def hf_default_tokenizer(default_model: ResolvedModel) -> Any:
    """transformers' tokenizer of the same GGUF (its own conversion of the GGUF vocabulary)."""
    from transformers import AutoTokenizer

    with fast_gguf_parsing():
        return AutoTokenizer.from_pretrained(
            default_model.path.parent, gguf_file=default_model.path.name
        )
