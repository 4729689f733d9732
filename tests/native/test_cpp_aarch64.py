"""Cross-builds the C++ unit tests (cpp/tests) for aarch64 and runs every one under qemu-user.

Off x86 the native library builds its portable paths only (cpu_isa() is portable; the x86
kernels sit behind PAGEDSERVE_X86, cpp/src/cpu/arch.hpp), so this checks that the library compiles
for ARM and that those paths pass there: once with qemu's `max` CPU model (every optional
extension, SVE included) and once with a plain Armv8.0 NEON core (cortex-a53). Release, -j2; all
eight test executables run (the slowest, test_paged_attention, takes seconds under qemu).
Skips, saying why, where the cross compiler, qemu-aarch64 or the aarch64 libraries are missing
(scripts/install.sh test installs them as root on Debian).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CXX = "aarch64-linux-gnu-g++"
QEMU = "qemu-aarch64"
# Debian's cross libraries (libc6-arm64-cross, libstdc++6-arm64-cross, libgomp1-arm64-cross).
SYSROOT = Path(os.environ.get("QEMU_LD_PREFIX", "/usr/aarch64-linux-gnu"))
CPU_MODELS = ["max", "cortex-a53"]  # everything qemu emulates; a plain NEON core
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
    build = tmp_path_factory.mktemp("aarch64") / "build"
    configure = [
        "cmake", "-S", str(ROOT), "-B", str(build),
        "-DCMAKE_SYSTEM_NAME=Linux", "-DCMAKE_SYSTEM_PROCESSOR=aarch64",
        f"-DCMAKE_CXX_COMPILER={CXX}", "-DCMAKE_BUILD_TYPE=Release",
        "-DPAGEDSERVE_BUILD_TESTS=ON", "-DPAGEDSERVE_BUILD_PYTHON=OFF",
        "-DPAGEDSERVE_CUDA=OFF", "-DPAGEDSERVE_NATIVE_ARCH=OFF",
    ]  # fmt: skip
    if shutil.which("ninja"):
        configure += ["-G", "Ninja"]
    _run(configure)
    _run(["cmake", "--build", str(build), "-j2"])
    return build


@pytest.mark.parametrize("cpu", CPU_MODELS)
def test_cpp_unit_tests_pass_under_qemu_aarch64(build: Path, cpu: str) -> None:
    assert TESTS, "no cpp/tests/test_*.cpp found"
    failures = []
    for name in TESTS:
        exe = build / name
        assert exe.is_file(), f"{name} was not built"
        cmd = [QEMU, "-cpu", cpu, "-L", str(SYSROOT), str(exe)]
        result = subprocess.run(cmd, cwd=build, capture_output=True, text=True, timeout=300)
        if result.returncode != 0:
            failures.append(f"{name} exited {result.returncode}:\n{result.stdout}{result.stderr}")
    assert not failures, f"under {QEMU} -cpu {cpu}:\n" + "\n".join(failures)


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        pytest.fail(
            f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
        )
    return result
