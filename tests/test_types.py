"""mypy --strict over the package stays clean (settings in pyproject.toml), and the test fake
engine type-checks as an EngineClient (tests/openai_compat/fake_engine.py's `as_client`).
mypy runs as a background job from the end of collection (tests/background.py: 50-75 s from a
clean checkout, on one core)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests import background

ROOT = Path(__file__).resolve().parents[1]


def _mypy() -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "mypy", "--strict", "pagedserve"]
    return background.run([*command, "tests/openai_compat/fake_engine.py"], cwd=ROOT)


MYPY = background.Job("mypy --strict", _mypy)


@pytest.mark.job(MYPY)
def test_mypy_strict_is_clean() -> None:
    result = MYPY.result()
    assert result.returncode == 0, result.stdout + result.stderr
