"""Run a module or a function against the pagedserve of a given source tree: the one way the A/B
scripts start a baseline's (or a candidate's) process. The import path is left as it is: the
tree's package is loaded from its folder (import_pagedserve_from), with its own compiled `_core`.

    python -m bench.common.in_tree TREE -m MODULE [ARGS...]       # MODULE as __main__
    python -m bench.common.in_tree TREE MODULE:FUNCTION [ARGS...]  # exit status FUNCTION(ARGS)
    python -m bench.common.in_tree TREE bench.common.in_tree:describe   # which build it loads

TREE "" (or the tree of the installed editable pagedserve) keeps the installed package. Run from
the repository root (bench.common.in_tree() builds the command line): bench/ is this checkout's,
whatever layout the tree's pagedserve has; first_module() imports engine internals from either.
"""

from __future__ import annotations

import importlib
import runpy
import sys
from types import ModuleType

from bench.common import import_pagedserve_from, is_installed_tree


def first_module(*names: str) -> ModuleType:
    """The first of `names` that exists (a module's home after issue 37's regrouping, then its
    home before it): `first_module("pagedserve.core.engine.llm_engine", "pagedserve.core.engine")`.
    An import error inside a module that exists is raised, not skipped."""
    for name in names:
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as e:
            missing = e.name or ""
            if not (name == missing or name.startswith(missing + ".")):
                raise
    raise ModuleNotFoundError(f"none of {', '.join(names)}")


def describe(argv: list[str]) -> int:
    """Print which pagedserve and compiled _core this process loaded, and where the engine
    internals the A/B children patch live (a check of a tree's layout and build)."""
    import pagedserve
    from pagedserve import _core

    engine = first_module("pagedserve.core.engine.llm_engine", "pagedserve.core.engine")
    runner = first_module("pagedserve.core.runner.model_runner", "pagedserve.core.model_runner")
    ops = first_module("pagedserve.core.attention.ops", "pagedserve.core.ops.attention")
    print(f"pagedserve {pagedserve.__file__}\n_core {_core.__file__}")
    for module, name in ((engine, "LLMEngine"), (runner, "ModelRunner"),
                         (ops, "paged_attention_eager")):  # fmt: skip
        print(f"{name} {module.__name__}:{getattr(module, name).__name__}")
    return 0


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[1] == "-m" and len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    tree, target, rest = argv[0], argv[1], argv[2:]
    if not is_installed_tree(tree):
        import_pagedserve_from(tree)
    if target == "-m":
        sys.argv = [rest[0], *rest[1:]]
        runpy.run_module(rest[0], run_name="__main__", alter_sys=True)
        return 0
    module, _, function = target.partition(":")
    if not function:
        sys.exit(f"in_tree: {target!r} is neither -m MODULE nor MODULE:FUNCTION")
    return int(getattr(importlib.import_module(module), function)(rest) or 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
