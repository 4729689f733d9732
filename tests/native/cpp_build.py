"""Builds the C++ unit tests (cpp/tests) in a folder of their own, for the tests that run them
(under sanitizers, under qemu for aarch64 and for emulated x86-64 CPUs): the library alone, no
Python module, no CUDA, no -march=native, with Ninja where it is installed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def build_cpp_tests(build: Path, *flags: str) -> Path:
    """Configures cpp/tests into `build` with the given extra CMake flags and builds them (-j2)."""
    configure = [
        "cmake", "-S", str(ROOT), "-B", str(build),
        "-DPAGEDSERVE_BUILD_TESTS=ON", "-DPAGEDSERVE_BUILD_PYTHON=OFF",
        "-DPAGEDSERVE_CUDA=OFF", "-DPAGEDSERVE_NATIVE_ARCH=OFF", *flags,
    ]  # fmt: skip
    if shutil.which("ninja"):
        configure += ["-G", "Ninja"]
    run_or_fail(configure)
    run_or_fail(["cmake", "--build", str(build), "-j2"])
    return build


def run_or_fail(cmd: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Runs cmd; a non-zero exit fails the test with its output."""
    result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        pytest.fail(
            f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
        )
    return result
