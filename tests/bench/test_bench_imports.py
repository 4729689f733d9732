"""bench/ imports its helpers as a package (bench.common): no script edits sys.path and none
imports a test module (tests may import bench.common, never the reverse)."""

from __future__ import annotations

import ast
from pathlib import Path

from bench.common import BENCH


def _offences(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        target = node.func if isinstance(node, ast.Call) else None
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            target = next((t for t in targets if "sys.path" in ast.unparse(t)), None)
        if target is not None and ast.unparse(target).startswith("sys.path"):
            found.append(f"{path}:{node.lineno}: {ast.unparse(target)}")
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        else:
            continue
        found += [f"{path}:{node.lineno}: imports {n}" for n in names if n.split(".")[0] == "tests"]
    return found


def test_no_bench_script_edits_sys_path_or_imports_tests() -> None:
    scripts = sorted(BENCH.rglob("*.py"))
    assert len(scripts) > 30
    offences = [o for path in scripts if ".work" not in path.parts for o in _offences(path)]
    assert not offences, "\n".join(offences)
