"""bench/ imports its helpers as a package (bench.common): no script edits sys.path, not even in
code it hands a child process as a string (a child that needs another tree's pagedserve runs
`python -m bench.common.in_tree TREE ...`), and none imports a test module (tests may import
bench.common, never the reverse)."""

from __future__ import annotations

import ast
from pathlib import Path

from bench.common import BENCH

PATH_WORDS = ("sys.path", "PYTHONPATH")  # the import path, in code, in strings, in shell


def _offences(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        target = node.func if isinstance(node, ast.Call) else None
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            target = next((t for t in targets if "sys.path" in ast.unparse(t)), None)
        if target is not None and ast.unparse(target).startswith("sys.path"):
            found.append(f"{path}:{node.lineno}: {ast.unparse(target)}")
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            words = [w for w in PATH_WORDS if w in node.value]
            found += [f"{path}:{node.lineno}: a string mentions {w}" for w in words]
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        else:
            continue
        found += [f"{path}:{node.lineno}: imports {n}" for n in names if n.split(".")[0] == "tests"]
    return found


def _shell_offences(path: Path) -> list[str]:
    lines = path.read_text().splitlines()
    return [f"{path}:{i}: {w}" for i, line in enumerate(lines, 1) for w in PATH_WORDS if w in line]


def _files(pattern: str) -> list[Path]:
    return [p for p in sorted(BENCH.rglob(pattern)) if ".work" not in p.parts]


def test_no_bench_script_edits_sys_path_or_imports_tests() -> None:
    scripts = _files("*.py")
    assert len(scripts) > 30
    offences = [o for path in scripts for o in _offences(path)]
    offences += [o for path in _files("*.sh") for o in _shell_offences(path)]
    assert not offences, "\n".join(offences)


def test_the_check_sees_code_in_strings(tmp_path: Path) -> None:
    """What the seven A/B scripts did before bench.common.in_tree: sys.path edited by the code
    string a child process ran (`python -c CODE`), and edited directly."""
    script = tmp_path / "ab.py"
    script.write_text(
        'WORKER = """\nimport sys\nsys.path[:0] = [sys.argv[1]]\n"""\n'
        "import sys\nsys.path.insert(0, '/tmp/base')\nsys.path += ['/tmp/base']\n"
        "from tests.core import helpers\n"
    )
    found = sorted(o.split(": ", 1)[1] for o in _offences(script))
    assert found == ["a string mentions sys.path", "imports tests.core", "sys.path",
                     "sys.path.insert"]  # fmt: skip
