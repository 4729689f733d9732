"""Cross-builds the C++ unit tests (cpp/tests) for aarch64 and runs every one under qemu-user.

On aarch64 the native library builds its portable paths and the NEON ones (the x86 kernels sit
behind PAGEDSERVE_X86, the NEON ones behind PAGEDSERVE_AARCH64, cpp/src/cpu/arch.hpp), chosen at
run time from Linux's hwcaps: ISA level neon on every aarch64 CPU, neon_dotprod where SDOT is
there. This checks that the library compiles for ARM and that every path passes there, the
NEON kernels bit for bit against the portable ones (test_linear_quant, test_paged_attention):
with qemu's `max` CPU model (every optional extension, dot product, i8mm and SVE included: level
neon_i8mm, so neon, neon_dotprod and neon_i8mm all run), with a Neoverse N1 (dot product, no
i8mm: level neon_dotprod) and with a plain Armv8.0 NEON core (cortex-a53: level neon). The level each model ran at is read from
test_cpu_features' last line and the paths from the kernel tests' own lines, so the test fails
if NEON went unused. Release, -j2; every test executable runs on every model, except
test_paged_attention (most of each model's time under qemu), whose halves run once each:
`max` runs its portable half (the portable kernels built for aarch64), cortex-a53, which lacks
every extension, its vector half (the NEON kernels, and their bits against portable's). The
vector half runs the same instructions on `max` (attention has one ARM level, neon, and the
build targets plain Armv8-a), so the stricter CPU alone runs it; neoverse-n1 runs neither,
since what sets it apart from cortex-a53 (the dot product) is used by the int8 linear alone.
Skips, saying why, where the cross compiler, qemu-aarch64 or the aarch64 libraries are missing
(scripts/install.sh test installs them as root on Debian).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.native.cpp_build import ROOT, build_cpp_tests

CXX = "aarch64-linux-gnu-g++"
QEMU = "qemu-aarch64"
# Debian's cross libraries (libc6-arm64-cross, libstdc++6-arm64-cross, libgomp1-arm64-cross).
SYSROOT = Path(os.environ.get("QEMU_LD_PREFIX", "/usr/aarch64-linux-gnu"))
CPU_MODELS = ["max", "neoverse-n1", "cortex-a53"]  # everything; dotprod, no i8mm; plain NEON
# The ISA level each model must run at, and the lines the kernel tests print for the paths run.
LEVELS = {"max": "neon_i8mm", "neoverse-n1": "neon_dotprod", "cortex-a53": "neon"}
_NEON = ["neon: neon path", "neon: neon int16 path"]
_DOTPROD = ["neon_dotprod: neon-dotprod path", "neon_dotprod: neon-dotprod int16 path"]
PATH_LINES = {
    "max": [
        *_NEON,
        *_DOTPROD,
        "neon_i8mm: neon-i8mm path",
        "neon_i8mm: neon-i8mm int16 path",
        "portable kernels",
    ],  # fmt: skip
    "neoverse-n1": [*_NEON, *_DOTPROD],
    "cortex-a53": [*_NEON, "neon kernels"],
}
ATTENTION_RUNS = {"max": [["portable"]], "neoverse-n1": [], "cortex-a53": [["vector"]]}
"""The argument lists test_paged_attention runs with on each model (none: not run there)."""
TESTS = sorted(p.stem for p in (ROOT / "cpp" / "tests").glob("test_*.cpp"))


def _missing() -> str | None:
    for tool in ("cmake", CXX, QEMU):
        if shutil.which(tool) is None:
            return f"needs {tool} (apt-get install g++-aarch64-linux-gnu qemu-user)"
    if not (SYSROOT / "lib" / "ld-linux-aarch64.so.1").exists():
        return f"no aarch64 libraries under {SYSROOT} (set QEMU_LD_PREFIX)"
    return None


pytestmark = pytest.mark.skipif(_missing() is not None, reason=_missing() or "")


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_cpp_tests(
        tmp_path_factory.mktemp("aarch64") / "build",
        "-DCMAKE_SYSTEM_NAME=Linux", "-DCMAKE_SYSTEM_PROCESSOR=aarch64",
        f"-DCMAKE_CXX_COMPILER={CXX}", "-DCMAKE_BUILD_TYPE=Release",
    )  # fmt: skip


@pytest.mark.parametrize("cpu", CPU_MODELS)
def test_cpp_unit_tests_pass_under_qemu_aarch64(build: Path, cpu: str) -> None:
    assert TESTS, "no cpp/tests/test_*.cpp found"
    failures, output = [], ""
    for name in TESTS:
        exe = build / name
        assert exe.is_file(), f"{name} was not built"
        for args in ATTENTION_RUNS[cpu] if name == "test_paged_attention" else [[]]:
            cmd = [QEMU, "-cpu", cpu, "-L", str(SYSROOT), str(exe), *args]
            result = subprocess.run(cmd, cwd=build, capture_output=True, text=True, timeout=300)
            output += result.stdout + result.stderr
            if result.returncode != 0:
                failures.append(f"{name} {' '.join(args)} exited {result.returncode}:\n"
                                f"{result.stdout}{result.stderr}")  # fmt: skip
    assert not failures, f"under {QEMU} -cpu {cpu}:\n" + "\n".join(failures)
    assert f"cpu isa level: {LEVELS[cpu]}\n" in output, f"-cpu {cpu} did not run at {LEVELS[cpu]}"
    missing = [line for line in PATH_LINES[cpu] if line not in output]
    assert not missing, f"under -cpu {cpu} these NEON paths did not run: {missing}"
