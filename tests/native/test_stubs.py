"""The type stubs of the compiled modules (pagedserve/_core.pyi, _cuda.pyi) name exactly what
the built modules hold, classes' members included: a binding added, renamed or dropped without
regenerating its stub fails here (mypy reads the stub, never the module)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from types import ModuleType

import pytest

import pagedserve

PACKAGE = Path(pagedserve.__file__).parent


def stub_names(tree: ast.Module | ast.ClassDef) -> dict[str, ast.stmt]:
    names: dict[str, ast.stmt] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef):
            names[node.name] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
    return {n: v for n, v in names.items() if not n.startswith("_")}


def public(obj: object) -> set[str]:
    return {n for n in dir(obj) if not n.startswith("_")}


def load(name: str) -> ModuleType:
    try:
        return importlib.import_module(f"pagedserve.{name}")
    except ImportError:
        pytest.skip(f"pagedserve.{name} is not built here")


@pytest.mark.parametrize("name", ["_core", "_cuda"])
def test_stub_names_what_the_module_holds(name: str) -> None:
    module = load(name)
    tree = ast.parse((PACKAGE / f"{name}.pyi").read_text())
    stubbed = stub_names(tree)
    assert set(stubbed) == public(module)
    for cls_name, node in stubbed.items():
        if not isinstance(node, ast.ClassDef):
            continue
        built = public(getattr(module, cls_name))
        if issubclass(getattr(module, cls_name), BaseException):
            continue  # exception classes inherit args / with_traceback
        assert set(stub_names(node)) == built, cls_name
