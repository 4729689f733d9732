"""mypy --strict over the package stays clean (settings in pyproject.toml), and the test fake
engine type-checks as an EngineClient (tests/openai_compat/fake_engine.py's `as_client`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_mypy_strict_is_clean() -> None:
    command = [sys.executable, "-m", "mypy", "--strict", "pagedserve"]
    command.append("tests/openai_compat/fake_engine.py")
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
