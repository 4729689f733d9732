"""mypy --strict over the package stays clean (settings in pyproject.toml), and the test fake
engine type-checks as an EngineClient (tests/openai_compat/fake_engine.py's `as_client`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_import_rules import imports_of, modules

ROOT = Path(__file__).resolve().parents[1]


def test_mypy_strict_is_clean() -> None:
    command = [sys.executable, "-m", "mypy", "--strict", "pagedserve"]
    command.append("tests/openai_compat/fake_engine.py")
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_skips_only_what_the_package_never_imports() -> None:
    """pyproject's mypy overrides with follow_imports = "skip" (transformers, which mypy would
    otherwise reach through gguf and xgrammar) make those modules Any without a word: fine
    while no module of pagedserve (nor the fake engine) imports them, wrong the day one does."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    skipped = [
        name
        for override in config["tool"]["mypy"].get("overrides", [])
        if override.get("follow_imports") == "skip"
        for name in override["module"]
    ]
    assert skipped, "no follow_imports = skip override left: drop this test"
    roots = {name.split(".")[0] for name in skipped}
    fake_engine = imports_of(ROOT / "tests" / "openai_compat" / "fake_engine.py")
    checked = {**modules(), "tests.openai_compat.fake_engine": fake_engine}
    for module, imported in checked.items():
        hit = {name for name in imported if name.split(".")[0] in roots}
        assert not hit, f"{module} imports {hit}, which mypy skips (pyproject.toml)"
