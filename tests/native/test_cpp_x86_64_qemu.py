"""One build for every x86-64 CPU (issue 24), run on CPUs this machine is not: qemu-user's x86-64
models report their own CPUID and raise SIGILL on any instruction they lack (qemu's TCG has no
AVX-512 at all), so code outside the run-time dispatch, a static initializer or a file compiled
for the wrong level that executes AVX-512 (or, on a pre-AVX CPU, AVX) kills the process, where
set_cpu_isa / PAGEDSERVE_MAX_CPU_ISA on the real CPU would not notice.

- The C++ unit tests (cpp/tests), built natively as the wheel builds the library (Release, no
  -march=native): in the editable install's own build folder, which `./scripts/install.sh test`
  configures with the tests (so the library compiles once), else in a fresh folder. Each runs
  under qemu-x86_64 as AMD Zen 3 (EPYC-Milan), AVX2 + FMA + F16C without AVX-512: they must run at level avx2, and the level and the paths
  run are read from the tests' own lines (test_cpu_features' "cpu isa level: X", the kernel
  tests' path lines), so a vector level that fell back, or one that never ran, fails. On an
  AMX Xeon qemu's TCG ran them ~150x slower than natively (test_paged_attention 455 s, against
  3 s), so the emulated run is what proves the build runs there, not every case again:
  test_paged_attention's `emulated` part (the best level, each cache kind once) and every other
  test but those that test threads rather than instructions (EMULATION_SKIPS); the native runs
  (Release and sanitized) keep the rest. Intel's Haswell-v4 was a second model at the same
  level and is no longer run.
- The installed pagedserve._core from Python, torch included (one interpreter under qemu per
  model, ~15-30 s): the level, each kernel family's path, and every int8 weight type's product
  (int8 and fp32 activations), one dense linear (where the level has it) and paged attention
  against their references, through the project's torch ops and the kernel tests' own helpers.
  Here as EPYC-Milan and as Nehalem (no AVX: level portable).

Each model runs only on a host whose best level is above the model's (runs_natively): emulating
a level the host runs natively proves nothing the native runs do not. So an AVX2 host (Zen 3)
runs the Nehalem probe alone. Nehalem gets the probe and not the C++ tests: what qemu adds there
is a CPU without AVX under the one build, which the probe puts under the wheel's own library
(every int8 type, attention, the level) without a second build of the library and the portable
C++ tests' slow run under TCG; those tests run natively at level portable everywhere (every
kernel test forces each level, the sanitized run included).

qemu 7.2's TCG has no AVX-VNNI (CPUID 7.1 EAX bit 4 stays clear even under `-cpu max` or
`+avx-vnni`), so no model here runs avx2_vnni. Skips, saying why, off x86-64 or without cmake,
a C++ compiler or qemu-x86_64 (scripts/install.sh test installs qemu-user as root on Debian).
"""

from __future__ import annotations

import json
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.native.cpp_build import ROOT, build_cpp_tests, installed_test_build
from tests.native.qemu_x86 import (
    QEMU,
    python_executable,
    qemu_missing,
    runs_natively,
    under_qemu,
)  # fmt: skip

LEVELS = {"EPYC-Milan": "avx2", "Nehalem": "portable"}
"""CPU model -> the ISA level the one build must run at there."""
CPP_MODELS = ["EPYC-Milan"]
PYTHON_MODELS = ["EPYC-Milan", "Nehalem"]
_AVX2 = [
    "cpu isa level: avx2\n",  # test_cpu_features
    "  avx2: avx2 path\n",  # test_linear_quant: the int8 kernel's AVX2 path
    "  avx2 kernels\n",  # test_paged_attention's emulated part at avx2
    "  avx2: rows bit-identical in calls of 1 .. 300\n",  # test_linear: the dense AVX2 path
]
PATH_LINES = {"EPYC-Milan": _AVX2}
_NO_STACK = "the decoder stack tests skip)\n"  # test_decoder_stack below avx2
ABSENT_LINES = {"EPYC-Milan": [_NO_STACK]}
"""Lines whose presence means a path the level should run was skipped."""
TESTS = sorted(p.stem for p in (ROOT / "cpp" / "tests").glob("test_*.cpp"))
SLOWEST_FIRST = ("test_linear", "test_paged_attention")  # ~13-70 s, ~15-60 s under TCG
EMULATED_ARGS = {"test_paged_attention": ["emulated"]}
EMULATION_SKIPS = ["linear_take_over_of_a_preempted_share_is_bit_identical"]
"""C++ tests (cpp/tests/check.hpp's CHECK_SKIP) that test threads, not instructions, and wait
for the OS to preempt one mid-product: under TCG on an AMX Xeon that took over 300 s (the
rest of test_linear: 38 s); the native runs keep them."""


def _missing() -> str | None:
    if shutil.which("c++") is None and shutil.which("g++") is None:
        return "needs a C++ compiler"
    if shutil.which("cmake") is None:
        return "needs cmake"
    return qemu_missing()


pytestmark = pytest.mark.skipif(_missing() is not None, reason=_missing() or "")


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The install's own build of the library and the tests, else a fresh one like it."""
    installed = installed_test_build(TESTS)
    if installed is not None:
        return installed
    return build_cpp_tests(
        tmp_path_factory.mktemp("x86_64") / "build", "-DCMAKE_BUILD_TYPE=Release"
    )


def _emulated(models: list[str]) -> list[object]:
    """The CPU models, each skipped where this CPU runs its level natively (runs_natively)."""
    params = []
    for cpu in models:
        why = _missing() or runs_natively(LEVELS[cpu])
        params.append(pytest.param(cpu, marks=pytest.mark.skipif(why is not None, reason=str(why))))
    return params


@pytest.mark.parametrize("cpu", _emulated(CPP_MODELS))
def test_cpp_unit_tests_pass_under_qemu_x86_64(build: Path, cpu: str) -> None:
    assert TESTS, "no cpp/tests/test_*.cpp found"
    names = sorted(TESTS, key=lambda name: name not in SLOWEST_FIRST)
    for name in names:
        assert (build / name).is_file(), f"{name} was not built"
    # Mostly single-threaded under TCG: one per core, two at least.
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 1)) as pool:
        env = {**os.environ, "CHECK_SKIP": ",".join(EMULATION_SKIPS)}
        futures = {
            n: pool.submit(under_qemu, cpu, [str(build / n), *EMULATED_ARGS.get(n, [])], build, env)
            for n in names
        }
    runs = {name: future.result() for name, future in futures.items()}
    timings = ", ".join(f"{name} {run.seconds:.1f} s" for name, run in runs.items())
    print(f"-cpu {cpu}: {timings}")
    failures = [f"{name} {run.status}:\n{run.output}" for name, run in runs.items() if run.rc]
    assert not failures, f"under {QEMU} -cpu {cpu} ({timings}):\n" + "\n".join(failures)
    output = "".join(run.output for run in runs.values())
    missing = [line for line in PATH_LINES[cpu] if line not in output]
    assert not missing, f"-cpu {cpu} should run at {LEVELS[cpu]}; lines not printed: {missing}"
    stray = [line for line in ABSENT_LINES[cpu] if line in output]
    assert not stray, f"-cpu {cpu} should run at {LEVELS[cpu]}; lines printed: {stray}"


PROBE = """
import json
import numpy as np
import torch
from gguf import GGMLQuantizationType as Q
from bench.common.attention_batches import make_batch
from test_attention_ops import assert_close, run_native, run_reference
from pagedserve.core.ops import native
from pagedserve.core.attention.ops import cpu_attention_path
from pagedserve.core.ops.cpu_features import cpu_isa, cpu_isa_supported
from pagedserve.core.ops.linear import native_linear_path
from pagedserve.core.ops.linear_quant import quant_linear_float_path, quant_linear_path
from tests.core.models.test_linear import make, reference
from tests.core.ops.test_linear_quant import float_product, float_tolerance, product, weight
from tests.quant_blocks import TYPES, int8_activations

m, n = 5, 40
for qtype in TYPES:  # every int8 weight type, int8 then fp32 activations
    k = 256 if qtype in (Q.Q4_K, Q.Q5_K, Q.Q6_K) else 96
    packed, w = weight(qtype, n, k, seed=m)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(n))
    got = product(qtype, packed, x, n).double().numpy()
    xq = int8_activations(x.numpy())
    bound = 1e-5 * (np.abs(xq) @ np.abs(w.T)) + 1e-7
    assert np.all(np.abs(got - xq @ w.T.astype(np.float64)) <= bound), f"quant_linear {qtype.name}"
    got = float_product(qtype, packed, x, n).double().numpy()
    want = x.double().numpy() @ w.T.astype(np.float64)
    bound = float_tolerance(x.double().numpy(), w) + 1e-30
    assert np.all(np.abs(got - want) <= bound), f"quant_linear {qtype.name}, fp32 activations"
for dtype in (torch.float32, torch.bfloat16):  # decodes and a prefill chunk, GQA
    batch = make_batch([1, 1, 7], [5, 40, 23], group=2, head_size=64, dtype=dtype)
    assert_close(run_native(batch), run_reference(batch), dtype)
if native_linear_path() != "none":
    layer = make(64, 48, True, torch.bfloat16)
    dense_w, dense_b = layer.weight.clone(), layer.bias.clone()
    assert layer.pack(), "Linear.pack() refused at a level with a dense path"
    x = torch.randn(7, 64).to(torch.bfloat16)
    want = reference(x, dense_w, dense_b, None)
    torch.testing.assert_close(layer(x, out_dtype=torch.float32), want, rtol=1e-4, atol=1e-4)
print(json.dumps({"supported": cpu_isa_supported(), "active": cpu_isa(),
                  "int8": quant_linear_path(), "dense": native_linear_path(),
                  "float": quant_linear_float_path(),
                  "attention": cpu_attention_path(), "core": native.core.__file__,
                  "torch": torch.backends.cpu.get_cpu_capability()}))
"""


@pytest.mark.parametrize("cpu", _emulated(PYTHON_MODELS))
def test_installed_core_and_ops_under_qemu_x86_64(cpu: str) -> None:
    level = LEVELS[cpu]
    env = {k: v for k, v in os.environ.items() if k != "PAGEDSERVE_MAX_CPU_ISA"}
    paths = [str(ROOT), str(ROOT / "tests" / "core" / "attention"), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    run = under_qemu(cpu, [python_executable(), "-c", PROBE], ROOT, env)
    print(f"-cpu {cpu}: python {run.seconds:.1f} s")
    assert run.rc == 0, f"python under {QEMU} -cpu {cpu} {run.status}:\n{run.output}"
    got = json.loads(run.output.strip().splitlines()[-1])
    dense = "none" if level == "portable" else level  # no dense kernel below avx2: torch's
    want = {"supported": level, "active": level, "int8": level, "float": level,
            "attention": level, "dense": dense}  # fmt: skip
    assert {key: got[key] for key in want} == want, f"-cpu {cpu} should run at {level}: {got}"
