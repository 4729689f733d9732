"""Builds the C++ unit tests (cpp/tests) with ASan + UBSan in a fresh folder and runs ctest."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(
    shutil.which("cmake") is None or (shutil.which("c++") is None and shutil.which("g++") is None),
    reason="needs cmake and a C++ compiler",
)
def test_cpp_unit_tests_pass_under_sanitizers(tmp_path: Path) -> None:
    build = tmp_path / "build"
    configure = [
        "cmake", "-S", str(ROOT), "-B", str(build),
        "-DCMAKE_BUILD_TYPE=Debug",
        "-DPAGEDSERVE_BUILD_TESTS=ON", "-DPAGEDSERVE_SANITIZE=ON",
        "-DPAGEDSERVE_BUILD_PYTHON=OFF", "-DPAGEDSERVE_CUDA=OFF", "-DPAGEDSERVE_NATIVE_ARCH=OFF",
    ]  # fmt: skip
    if shutil.which("ninja"):
        configure += ["-G", "Ninja"]
    _run(configure)
    _run(["cmake", "--build", str(build), "-j2"])
    result = _run(["ctest", "--output-on-failure", "--timeout", "300"], cwd=build)
    assert "tests passed" in result.stdout


def _run(cmd: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        pytest.fail(
            f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
        )
    return result
