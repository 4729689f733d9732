"""Builds the C++ unit tests (cpp/tests) with ASan + UBSan in a fresh folder and runs ctest: a
background job from the end of collection (tests/background.py), ~75 s of building and ~20 s
of ctest on 2 cores."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests import background
from tests.native.cpp_build import build_cpp_tests, run_or_fail


def _build_and_run() -> subprocess.CompletedProcess[str]:
    build = build_cpp_tests(
        background.folder() / "sanitized", "-DCMAKE_BUILD_TYPE=Debug", "-DPAGEDSERVE_SANITIZE=ON",
        nice=True,
    )  # fmt: skip
    ctest = ["ctest", "-j2", "--output-on-failure", "--timeout", "1200"]
    return run_or_fail(ctest, cwd=build, nice=True)


SANITIZED = background.Job("C++ tests under ASan + UBSan", _build_and_run)


@pytest.mark.skipif(
    shutil.which("cmake") is None or (shutil.which("c++") is None and shutil.which("g++") is None),
    reason="needs cmake and a C++ compiler",
)
@pytest.mark.job(SANITIZED)
def test_cpp_unit_tests_pass_under_sanitizers() -> None:
    result = SANITIZED.result()
    assert "tests passed" in result.stdout
