"""Builds the C++ unit tests (cpp/tests) with ASan + UBSan in a fresh folder and runs ctest."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.native.cpp_build import build_cpp_tests, run_or_fail


@pytest.mark.skipif(
    shutil.which("cmake") is None or (shutil.which("c++") is None and shutil.which("g++") is None),
    reason="needs cmake and a C++ compiler",
)
def test_cpp_unit_tests_pass_under_sanitizers(tmp_path: Path) -> None:
    build = build_cpp_tests(
        tmp_path / "build", "-DCMAKE_BUILD_TYPE=Debug", "-DPAGEDSERVE_SANITIZE=ON"
    )
    result = run_or_fail(["ctest", "-j2", "--output-on-failure", "--timeout", "300"], cwd=build)
    assert "tests passed" in result.stdout
