"""docs/design.md's import rules, checked by walking every module's imports (ast, no execution)."""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import pagedserve

PACKAGE = Path(pagedserve.__file__).parent
STDLIB_ONLY = [
    "config",
    "sampling_params",
    "pooling_params",
    "request",
    "outputs",
    "errors",
    "sched.kv_cache",
    "lora_request",
]
NO_TORCH = [
    "sched.scheduler",
    "sched.kv_cache",
    "gguf_reader",
    "ops.native",
    "engine.llm_engine",  # itself: the model runner it drives is the tensors' owner
    "engine.output_processor",
    "engine.step_inputs",
    "engine.admission",
    "engine.output_stream",
    "engine.combinations",
    "runner.step_result",
    "engine_client",
    "spec_decode.ngram",
    "spec_decode.speculator",
    "spec_decode.verify",
]
TORCH_FREE_CLOSURE = [m for m in NO_TORCH if m != "engine.llm_engine"] + ["request", "config"]
"""Modules whose every import, transitively, loads no torch (checked by importing them)."""
LAYERS = [
    {
        "config",
        "errors",
        "outputs",
        "sampling_params",
        "pooling_params",
        "gguf_reader",
        "lora_request",
    },
    {"ops"},  # the native kernels' wrappers and the CPU's ISA levels
    {"tokenizers", "sched", "structured", "multimodal"},
    {"attention", "sampling", "request", "engine_client"},
    {"distributed", "lora"},  # the tensor-parallel group and the step channel; LoRA adapters
    {"models"},
    {"device_policy", "spec_decode", "executor"},
    {"runner"},
    {"engine"},
]
"""pagedserve.core's packages (and loose modules), bottom first: a module imports only from its
own layer and the ones below (docs/design.md's picture)."""
SERVER_LIBS = {"starlette", "hypercorn", "orjson", "pydantic", "prometheus_client"}


def imports_of(path: Path, every_from: bool = False) -> set[str]:
    """Top-level names this file imports, with pagedserve's own spelled out in full
    (every_from: `from pagedserve.x import name` counts pagedserve.x.name too)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            if node.module == "pagedserve" or (every_from and node.module.startswith("pagedserve")):
                names.update(f"pagedserve.{alias.name}" for alias in node.names)
    return names


@functools.cache
def modules() -> dict[str, set[str]]:
    """Every module of the package and what it imports (parsed once: ~0.6 s; do not mutate)."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        dotted = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        found[dotted] = imports_of(path)
    return found


def test_walk_finds_the_package() -> None:
    assert "pagedserve.core.engine.llm_engine" in modules()


def test_core_never_imports_the_server_side() -> None:
    for name, imported in modules().items():
        if name.startswith("pagedserve.core"):
            roots = {i.split(".")[0] for i in imported}
            assert not roots & SERVER_LIBS, f"{name} imports {roots & SERVER_LIBS}"
            assert not any(i.startswith("pagedserve.openai_compat") for i in imported), name


@pytest.mark.parametrize("module", STDLIB_ONLY)
def test_stdlib_only_modules(module: str) -> None:
    imported = modules()[f"pagedserve.core.{module}"]
    for name in imported:
        root = name.split(".")[0]
        assert root in sys.stdlib_module_names or root in ("__future__", "pagedserve"), (
            f"core.{module} imports {name}"
        )
        if root == "pagedserve":
            leaf = name.split(".")[-1]
            # Named for types only (under TYPE_CHECKING): the detokenizer, the grammar state,
            # a request's images.
            assert leaf in STDLIB_ONLY or name.endswith(
                ("detokenizer", "structured.state", "multimodal.inputs")
            ), name


@pytest.mark.parametrize("module", NO_TORCH)
def test_bookkeeping_never_imports_torch(module: str) -> None:
    imported = modules()[f"pagedserve.core.{module}"]
    assert not any(i.split(".")[0] == "torch" for i in imported)


def test_the_server_side_holds_the_engine_through_the_protocol() -> None:
    """openai_compat sees the engine only as core.engine_client's EngineClient."""
    engine_modules = ("pagedserve.core.engine.async_engine", "pagedserve.core.engine.llm_engine")
    for name, imported in modules().items():
        if name.startswith("pagedserve.openai_compat"):
            assert not set(imported) & set(engine_modules), name


def test_ops_never_import_models() -> None:
    """The models build on the ops, never the other way."""
    ops = {n: i for n, i in modules().items() if n.startswith("pagedserve.core.ops")}
    assert len(ops) >= 6
    for name, imported in ops.items():
        assert not any(i.startswith("pagedserve.core.models") for i in imported), name


def test_each_compiled_module_has_one_importer() -> None:
    for compiled in ("pagedserve._core", "pagedserve._cuda"):
        importers = [n for n, imported in modules().items() if compiled in imported]
        assert importers == ["pagedserve.core.ops.native"], (compiled, importers)


TOKENIZER_SIDE = (
    "pagedserve.core.tokenizers.load",
    "pagedserve.core.tokenizers",
    "pagedserve.core.gguf_reader",
)


def test_tokenizers_never_import_models_ops_or_torch() -> None:
    found = 0
    for name, imported in modules().items():
        if name.startswith(TOKENIZER_SIDE):
            found += 1
            for i in imported:
                assert i.split(".")[0] != "torch", f"{name} imports {i}"
                assert not i.startswith(("pagedserve.core.models", "pagedserve.core.ops")), name
    assert found >= 5


def test_loading_the_tokenizer_side_imports_no_torch() -> None:
    """Transitively, at run time: a GGUF vocabulary loads without torch or the native ops."""
    code = (
        "import sys, pagedserve.core.tokenizers.load; "
        "bad = [m for m in sys.modules if m == 'torch' or m.startswith('pagedserve.core.ops')]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_gpt2_gguf_vocabulary_loads_without_protobuf(default_model: Any) -> None:
    """sentencepiece's ModelProto (protobuf, ~3 MiB resident) loads only for the vocabularies
    that need it (issue 42 item 4): not for the default model's gpt2 one."""
    code = (
        "import sys; from pagedserve.core.tokenizers.load import load_tokenizer; "
        "assert load_tokenizer(sys.argv[1]).encode('Paris'); "
        "bad = [m for m in sys.modules if m.startswith(('google.protobuf', 'sentencepiece_model'))"
        " or m.endswith('sentencepiece_model_pb2')]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code, str(default_model.path)], check=True)


def test_the_server_app_loads_without_httpx() -> None:
    """httpx (with its command line's rich, pygments and click: ~5.6 MiB resident) loads on the
    first image URL a request names, not with the server (issue 42 item 4)."""
    code = (
        "import sys; import pagedserve.cli; from pagedserve.openai_compat.app import create_app; "
        "bad = [m for m in ('httpx', 'rich', 'pygments') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_text_server_loads_image_and_schema_packages_on_demand() -> None:
    """PIL (~2 MiB resident; with the first image), jsonschema (~3 MiB with its format
    checkers' packages; with the first JSON schema) and safetensors (with the first HF folder)
    are not loaded by the server or the engine it builds (issue 42 item 4)."""
    code = (
        "import sys; import pagedserve.cli; from pagedserve.openai_compat.app import create_app; "
        "import pagedserve.core.engine.async_engine, pagedserve.core.models.registry; "
        "bad = [m for m in ('PIL', 'jsonschema', 'safetensors') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_no_import_cycles() -> None:
    """Every import of pagedserve's own modules (TYPE_CHECKING and function-level ones too)
    points one way: app -> routes -> state, never back."""
    graph = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        name = name.removesuffix(".__init__")
        # a module's own packages run before it whatever it imports: not an edge
        own = {i for i in imports_of(path, every_from=True) if i.startswith("pagedserve.")}
        graph[name] = {i for i in own if not name.startswith(i + ".")}
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, " -> ".join((*path[path.index(name) :], name))
        if name in done or name not in graph:
            return
        for target in graph[name]:
            visit(target, (*path, name))
        done.add(name)

    for name in graph:
        visit(name, ())


def _core_unit(module: str) -> str:
    """The package (or loose module) of pagedserve.core that `module` belongs to."""
    return module.removeprefix("pagedserve.core.").split(".")[0]


def _layer(unit: str) -> int:
    found = [i for i, layer in enumerate(LAYERS) if unit in layer]
    assert found, f"pagedserve.core.{unit} is in no layer of LAYERS: add it where it belongs"
    return found[0]


def test_core_imports_only_go_down() -> None:
    for name, imported in modules().items():
        if not name.startswith("pagedserve.core.") or name.endswith("core.__init__"):
            continue
        own = _layer(_core_unit(name))
        for target in imported:
            if target.startswith("pagedserve.core."):
                assert _layer(_core_unit(target)) <= own, f"{name} imports {target}: upward"


def test_no_two_packages_import_each_other() -> None:
    """Transitively: the graph of packages (pagedserve.core's packages and loose modules, the
    other top-level parts of pagedserve) has no cycle."""
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        unit = _unit(name)
        targets = {
            _unit(i) for i in imports_of(path, every_from=True) if i.startswith("pagedserve.")
        }
        graph.setdefault(unit, set()).update(targets - {unit})
    done: set[str] = set()

    def visit(unit: str, path: tuple[str, ...]) -> None:
        assert unit not in path, " -> ".join((*path[path.index(unit) :], unit))
        if unit in done or unit not in graph:
            return
        for target in graph[unit]:
            visit(target, (*path, unit))
        done.add(unit)

    assert {"core.models", "core.attention", "core.engine", "openai_compat"} <= set(graph)
    for unit in graph:
        visit(unit, ())


def _unit(module: str) -> str:
    parts = module.removeprefix("pagedserve.").split(".")
    return ".".join(parts[:2]) if parts[0] == "core" and len(parts) > 1 else parts[0]


@pytest.mark.parametrize("module", TORCH_FREE_CLOSURE)
def test_torch_free_modules_load_no_torch(module: str) -> None:
    code = (
        f"import sys, pagedserve.core.{module}; "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


SERVER = "pagedserve.openai_compat"
ENDPOINTS = (
    "chat",
    "completions",
    "embeddings",
    "responses",
    "infill",
    "messages",
    "rerank",
    "lora",
)
# What an endpoint package may import besides common/ and itself: /v1/responses is served on
# the chat machinery (its items become chat messages, chat's service generates); /infill builds
# its prompt with completions' fill-in-the-middle helpers (completions/fim.py); /v1/messages is
# served on the chat machinery too (its blocks become chat messages); /v1/rerank and /v1/score
# run their pairs on embeddings' machinery (embed_all: prefill-only requests, batched).
ENDPOINT_USES = {
    "responses": {"chat"},
    "infill": {"completions"},
    "messages": {"chat"},
    "rerank": {"embeddings"},
}


def server_part(dotted: str) -> str | None:
    """The part of openai_compat a module belongs to: an endpoint, common, or top (the app)."""
    if not dotted.startswith(SERVER + "."):
        return None
    part = dotted.removeprefix(SERVER + ".").split(".")[0]
    return part if part in (*ENDPOINTS, "common") else "top"


def test_the_server_side_is_layered_app_endpoints_common() -> None:
    """openai_compat's imports go down: the app (app, routes, state, openapi, ui, server_config)
    -> the endpoint packages -> common/; common imports no endpoint and endpoints import each
    other only as ENDPOINT_USES says (TYPE_CHECKING and function-level imports too)."""
    parts_seen = set()
    for path in (PACKAGE / "openai_compat").rglob("*.py"):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        part = server_part(name)
        parts_seen.add(part)
        for target in imports_of(path, every_from=True):
            used = server_part(target)
            if used is None or used == part or part == "top":
                continue
            assert used != "top", f"{name} imports {target}, a module above it"
            if part == "common":
                raise AssertionError(f"{name} (common) imports {target}, an endpoint")
            assert used == "common" or used in ENDPOINT_USES.get(part, ()), f"{name} -> {target}"
    assert parts_seen == {*ENDPOINTS, "common", "top"}


POOL = ("model_pool", "model_lease", "model_catalog")
"""The model pool (issue 39), in the app's layer beneath state.py: it holds engines as
EngineClients and knows no endpoint, so every endpoint's service can be built over any model."""


def test_the_model_pool_sits_beneath_the_app_above_common() -> None:
    """model_pool, model_lease and model_catalog import no endpoint and no other app module
    (but each other); state.py builds the endpoints' services over the pool's engines."""
    found = modules()
    for module in POOL:
        name = f"{SERVER}.{module}"
        for target in found[name]:
            part = server_part(target)
            if part is None:
                continue
            mine = target.removeprefix(SERVER + ".").split(".")[0] in POOL
            assert part == "common" or mine, f"{name} imports {target}"
