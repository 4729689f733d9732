"""The tree stays ruff-clean (lint and format), as pyproject.toml configures it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=["lint", "format"])
def test_ruff(command: list[str]) -> None:
    ruff = shutil.which("ruff")
    assert ruff is not None, "ruff is a test dependency (pip install -e '.[test]')"
    result = subprocess.run(
        [ruff, *command, "pagedserve", "tests", "bench"], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
