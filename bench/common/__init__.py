"""The one home of what bench scripts share (and tests may import; bench never imports tests):
paths, a free port, a live server (server.py), tiny model fixtures (tiny_*.py), the families'
oracle, the schema fuzz and random attention batches."""

from __future__ import annotations

from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parents[1]
ROOT = BENCH.parent
WORK = BENCH / ".work"  # git-ignored: builds, run folders, logs
RESULTS = BENCH / "RESULTS.md"  # the page of current figures per CPU kind
RESULTS_LOG = BENCH / "RESULTS-log.md"  # the dated history; scripts that write figures append here


def native_dir(tree: str) -> Path | None:
    """Where a source tree's compiled `_core` module lies: beside its sources (pagedserve/), else
    the newest one under its build/ folder (`cmake -B TREE/build`, scikit-build's build dirs)."""
    root = Path(tree).resolve()
    if any((root / "pagedserve").glob("_core*.so")):
        return root / "pagedserve"
    built = sorted((root / "build").glob("**/_core*.so"), key=lambda p: p.stat().st_mtime)
    return built[-1].parent if built else None


def is_installed_tree(tree: str) -> bool:
    """The empty tree or the one the installed (editable) pagedserve comes from: import as is."""
    import importlib.util

    if not tree:
        return True
    spec = importlib.util.find_spec("pagedserve")  # finds the package without importing it
    origin = spec.origin if spec is not None else None
    return origin is not None and Path(origin).resolve().parent.parent == Path(tree).resolve()


def import_pagedserve_from(tree: str) -> None:
    """Make `import pagedserve` in this process load a source checkout with its own `_core` build
    (an A/B baseline: beside its sources or under its build/, see native_dir) instead of the
    editable install, leaving the import path as it is. Call it before anything imports pagedserve."""
    import importlib.util
    import sys

    natives = native_dir(tree)
    if natives is None:
        raise SystemExit(
            f"{tree}: no compiled pagedserve/_core*.so in it nor under its build/: build it"
            " (python -m bench.engine.determinism_cost --help shows how) or pass this checkout"
        )
    sys.meta_path[:] = [f for f in sys.meta_path if "ScikitBuild" not in type(f).__name__]
    package = Path(tree).resolve() / "pagedserve"
    locations = [str(package)] + ([str(natives)] if natives != package else [])
    spec = importlib.util.spec_from_file_location(
        "pagedserve", package / "__init__.py", submodule_search_locations=locations
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["pagedserve"] = module
    spec.loader.exec_module(module)


def in_tree(tree: str, *target: str) -> list[str]:
    """The command line of a child process that runs `target` against the pagedserve of `tree`
    ("" or this checkout: the installed one): `-m MODULE ARGS...` or `MODULE:FUNCTION ARGS...`
    (bench/common/in_tree.py). Run it with cwd=ROOT, so that `bench` is importable."""
    import sys

    tree = str(Path(tree).resolve()) if tree else ""  # the child runs in ROOT
    return [sys.executable, "-m", "bench.common.in_tree", tree, *target]


def tree_json(tree: str, *target: str) -> Any:
    """Run `target` against the pagedserve of `tree` in a child process (in_tree) and return the
    JSON of the last line it printed; a failed child ends this process with its stderr."""
    import json
    import subprocess
    import sys

    done = subprocess.run(in_tree(tree, *target), capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        sys.exit(f"{tree}: the worker failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
