"""Builds the C++ unit tests (cpp/tests) for the tests that run them (under sanitizers, under
qemu for aarch64 and for emulated x86-64 CPUs): in a folder of their own (the library alone, no
Python module, no CUDA, no -march=native, with Ninja where it is installed), or, for a build
like the wheel's, in the editable install's own build folder where it was configured with them."""

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


def installed_test_build(targets: list[str]) -> Path | None:
    """The editable install's own build folder (scikit-build-core's build/<wheel tag>), where
    ./scripts/install.sh test configured it with the C++ tests as the wheel builds the library
    (Release, no -march=native, no sanitizers), with `targets` brought up to date with the
    sources (a no-op right after the install); None where there is no such folder, or where
    it no longer builds on its own (one that an isolated pip build configured regenerates
    without the pybind11 that pip deleted)."""
    wanted = {
        "CMAKE_HOME_DIRECTORY": str(ROOT), "CMAKE_BUILD_TYPE": "Release",
        "PAGEDSERVE_BUILD_TESTS": "ON", "PAGEDSERVE_NATIVE_ARCH": "OFF", "PAGEDSERVE_SANITIZE": "OFF",
    }  # fmt: skip
    for cache in sorted(ROOT.glob("build/*/CMakeCache.txt")):
        entries = cmake_cache(cache)
        if all(entries.get(key) == value for key, value in wanted.items()):
            command = ["cmake", "--build", str(cache.parent), "-j2", "--target", *targets]
            built = subprocess.run(command, capture_output=True, text=True, timeout=900)
            return cache.parent if built.returncode == 0 else None
    return None


def cmake_cache(path: Path) -> dict[str, str]:
    """A CMakeCache.txt's entries: NAME:TYPE=VALUE lines as {NAME: VALUE}."""
    entries = {}
    for line in path.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and ":" in key and not line.startswith(("//", "#")):
            entries[key.split(":")[0]] = value
    return entries


def run_or_fail(cmd: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Runs cmd; a non-zero exit fails the test with its output."""
    result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        pytest.fail(
            f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
        )
    return result
