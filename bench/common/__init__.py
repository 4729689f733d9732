"""The one home of what bench scripts share (and tests may import; bench never imports tests):
paths, a free port, a live server (server.py), tiny model fixtures (tiny_*.py), the families'
oracle, the schema fuzz and random attention batches."""

from __future__ import annotations

from pathlib import Path

BENCH = Path(__file__).resolve().parents[1]
ROOT = BENCH.parent
WORK = BENCH / ".work"  # git-ignored: builds, run folders, logs
RESULTS = BENCH / "RESULTS.md"  # the page of current figures per CPU kind
RESULTS_LOG = BENCH / "RESULTS-log.md"  # the dated history; scripts that write figures append here


def import_pagedserve_from(tree: str) -> None:
    """Make `import pagedserve` in this process load a source checkout with its own `_core` build
    (an A/B baseline) instead of the editable install. Call it before anything imports pagedserve."""
    import importlib.util
    import sys

    sys.meta_path[:] = [f for f in sys.meta_path if "ScikitBuild" not in type(f).__name__]
    package = Path(tree).resolve() / "pagedserve"
    spec = importlib.util.spec_from_file_location(
        "pagedserve", package / "__init__.py", submodule_search_locations=[str(package)]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["pagedserve"] = module
    spec.loader.exec_module(module)
