"""The `pagedserve serve` flags: argv and env -> frozen configs.

Flag help comes from the config dataclasses' field docstrings (`field_docs`), so the two never
disagree; this module and cli.py are the only ones that read argv or the environment, but for
PAGEDSERVE_MAX_CPU_ISA, which ops/cpu_features.py reads so that the cap holds in child
processes and tests too.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import json
from collections.abc import Mapping
from dataclasses import MISSING, fields
from functools import cache
from typing import Any

from pagedserve import __version__
from pagedserve.core.config import (
    CPU_ISAS,
    CPU_LINEARS,
    KV_CACHE_DTYPE_NAMES,
    QUANTIZED_ACTIVATIONS,
    SPECULATIVE_METHODS,
    TASKS,
    CacheConfig,
    EngineConfig,
    KVEventsConfig,
    LoRAConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    SpeculativeConfig,
)
from pagedserve.core.models.resolve import names_a_model
from pagedserve.openai_compat.model_catalog import ModelsConfig
from pagedserve.openai_compat.server_config import (
    REASONING_PARSERS,
    TOOL_CALL_PARSERS,
    ServerConfig,
    parse_mm_limit,
)

DESCRIPTION = (
    "`pagedserve serve [MODEL]`: argv and env -> frozen configs -> hypercorn serving the app."
)
API_KEY_ENV = "PAGEDSERVE_API_KEY"
LORA_UPDATING_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"


def _lora_modules(values: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple(values.get("lora_modules") or ())


def _lora_module(text: str) -> tuple[str, str]:
    """--lora-modules: NAME=PATH, or vLLM's JSON {"name": ..., "path": ...}."""
    if text.lstrip().startswith("{"):
        try:
            value = json.loads(text)
        except ValueError:
            value = None
        if isinstance(value, dict) and all(isinstance(value.get(k), str) for k in ("name", "path")):
            return value["name"], value["path"]
        raise argparse.ArgumentTypeError(f'lora_modules JSON needs "name" and "path", got {text!r}')
    name, sep, path = text.partition("=")
    if not (sep and name and path):
        raise argparse.ArgumentTypeError(f"lora_modules takes NAME=PATH, got {text!r}")
    return name, path


def _mm_limit(text: str) -> int:
    try:
        return parse_mm_limit(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# (config class, field name, argparse extras). Order is the order of --help.
_FLAGS: list[tuple[type, str, dict[str, Any]]] = [
    (ServerConfig, "host", {}),
    (ServerConfig, "port", {"type": int}),
    (ServerConfig, "api_key", {}),
    (ServerConfig, "served_model_name", {"nargs": "+", "metavar": "NAME"}),
    (ServerConfig, "allowed_origins", {"nargs": "+", "metavar": "ORIGIN"}),
    (ServerConfig, "ui", {"action": argparse.BooleanOptionalAction}),
    (ServerConfig, "log_level", {"choices": ["debug", "info", "warning", "error"]}),
    (ServerConfig, "graceful_timeout", {"type": float}),
    (ServerConfig, "access_log", {"action": argparse.BooleanOptionalAction}),
    (ServerConfig, "tool_call_parser", {"choices": list(TOOL_CALL_PARSERS)}),
    (ServerConfig, "reasoning_parser", {"choices": list(REASONING_PARSERS)}),
    (ServerConfig, "response_store_size", {"type": int}),
    (ServerConfig, "response_store_mb", {"type": int}),
    (ServerConfig, "response_store_ttl", {"type": float}),
    (ServerConfig, "max_body_bytes", {"type": int, "help": argparse.SUPPRESS}),
    (ServerConfig, "allowed_local_media_path", {"metavar": "DIR"}),
    (ServerConfig, "limit_mm_per_prompt", {"type": _mm_limit, "metavar": "JSON"}),
    (ServerConfig, "media_fetch_timeout", {"type": float, "metavar": "SECONDS"}),
    (ServerConfig, "media_max_bytes", {"type": int}),
    (ModelsConfig, "models_dir", {"metavar": "DIR"}),
    (ModelsConfig, "models_config", {"metavar": "FILE"}),
    (ModelsConfig, "max_loaded_models", {"type": int}),
    (ModelsConfig, "models_memory", {"type": float, "metavar": "GIB"}),
    (ModelsConfig, "idle_unload", {"type": float, "metavar": "SECONDS"}),
    (ModelConfig, "task", {"choices": list(TASKS)}),
    (ModelConfig, "matryoshka", {"action": argparse.BooleanOptionalAction}),
    (ModelConfig, "max_model_len", {"type": int}),
    (ModelConfig, "dtype", {}),
    (ModelConfig, "quantization", {"choices": ["auto", "none"]}),
    (ModelConfig, "quantized_activations", {"choices": list(QUANTIZED_ACTIVATIONS)}),
    (ModelConfig, "cpu_linear", {"choices": list(CPU_LINEARS)}),
    (ModelConfig, "cpu_isa", {"choices": list(CPU_ISAS)}),
    (ModelConfig, "device", {}),
    (ModelConfig, "chat_template", {}),
    (ModelConfig, "mmproj", {"metavar": "FILE"}),
    (ModelConfig, "attention_backend", {}),
    (ModelConfig, "seed", {"type": int}),
    (ModelConfig, "deterministic", {"action": argparse.BooleanOptionalAction}),
    (CacheConfig, "kv_cache_memory", {"type": float, "metavar": "GIB"}),
    (CacheConfig, "gpu_memory_utilization", {"type": float}),
    (CacheConfig, "page_size", {"type": int}),
    (CacheConfig, "enable_prefix_caching", {"action": argparse.BooleanOptionalAction}),
    (CacheConfig, "kv_cache_dtype", {"choices": list(KV_CACHE_DTYPE_NAMES)}),
    (CacheConfig, "num_pages", {"type": int, "help": argparse.SUPPRESS}),
    (SchedulerConfig, "max_num_seqs", {"type": int}),
    (SchedulerConfig, "max_num_batched_tokens", {"type": int}),
    (SchedulerConfig, "max_prefill_tokens_while_decoding", {"type": int}),
    (SchedulerConfig, "max_waiting", {"type": int}),
    (SpeculativeConfig, "speculative_method", {"choices": list(SPECULATIVE_METHODS)}),
    (SpeculativeConfig, "num_speculative_tokens", {"type": int}),
    (SpeculativeConfig, "ngram_max", {"type": int}),
    (SpeculativeConfig, "ngram_min", {"type": int}),
    (SpeculativeConfig, "speculative_model", {}),
    (SpeculativeConfig, "speculative_max_batch", {"type": int}),
    (LoRAConfig, "enable_lora", {"action": "store_true", "default": None}),
    (LoRAConfig, "lora_modules", {"nargs": "+", "type": _lora_module, "metavar": "NAME=PATH"}),
    (LoRAConfig, "max_loras", {"type": int}),
    (LoRAConfig, "max_lora_rank", {"type": int}),
    (ServerConfig, "allow_runtime_lora_updating", {"action": "store_true", "default": None}),
    # default None: the environment (_PARALLEL_ENV) fills what no flag gives, then the field.
    (ParallelConfig, "tensor_parallel_size", {"type": int, "default": None}),
    (ParallelConfig, "nnodes", {"type": int, "default": None}),
    (ParallelConfig, "node_rank", {"type": int, "default": None}),
    (ParallelConfig, "master_addr", {"default": None}),
    (ParallelConfig, "master_port", {"type": int, "default": None}),
    (ParallelConfig, "distributed_timeout", {"type": float, "metavar": "SECONDS"}),
]

# torch.distributed's usual environment, for the flags not given (RANK: this node's launcher's
# rank, i.e. the node's index, when NODE_RANK is not set).
_PARALLEL_ENV: dict[str, tuple[type, tuple[str, ...]]] = {
    "tensor_parallel_size": (int, ("WORLD_SIZE",)),
    "nnodes": (int, ("NNODES",)),
    "node_rank": (int, ("NODE_RANK", "RANK")),
    "master_addr": (str, ("MASTER_ADDR",)),
    "master_port": (int, ("MASTER_PORT",)),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pagedserve", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"pagedserve {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="Serve a model over the OpenAI API.")
    serve.add_argument("model", nargs="?", default="", help=field_docs(ModelConfig)["model"])
    for cls, name, extra in _FLAGS:
        default = next(f.default for f in fields(cls) if f.name == name)
        kwargs: dict[str, Any] = {"default": None if default is MISSING else default}
        kwargs["help"] = field_docs(cls).get(name, "")
        kwargs.update(extra)
        if kwargs["help"] is not argparse.SUPPRESS and kwargs["default"] not in (None, ()):
            kwargs["help"] += " (default: %(default)s)"
        serve.add_argument("--" + name.replace("_", "-"), **kwargs)
    serve.add_argument("--kv-events-config", metavar="JSON", help=_KV_EVENTS_HELP)
    return parser


_KV_EVENTS_HELP = (
    "KV events for prefix-aware routers (llm-d, Dynamo), as vLLM's flag takes them: e.g. "
    '\'{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557", '
    '"replay_endpoint": "tcp://*:5558", "topic": ""}\'; also buffer_steps, hwm, '
    "max_queue_size (default: off)"
)


def configs_from_args(
    args: argparse.Namespace, env: Mapping[str, str]
) -> tuple[ServerConfig, EngineConfig]:
    """Frozen configs from parsed flags; raises ValueError naming a bad field."""
    values = vars(args)

    def pick(cls: type) -> dict[str, Any]:
        return {n: values[n] for c, n, _ in _FLAGS if c is cls and values.get(n) is not None}

    server_values = pick(ServerConfig)
    server_values.setdefault("api_key", env.get(API_KEY_ENV) or None)
    if env.get(LORA_UPDATING_ENV, "").lower() in ("1", "true"):
        server_values["allow_runtime_lora_updating"] = True
    model, names = _model_and_names(args.model, tuple(values.get("served_model_name") or ()))
    server_values["allowed_origins"] = tuple(server_values.get("allowed_origins", ()))
    server = ServerConfig(**{**server_values, "served_model_name": names})
    kv_events = KVEventsConfig.from_json(values.get("kv_events_config") or "{}")
    if server.model_name:  # `{model}` is the name responses carry (vLLM's first served name)
        kv_events = kv_events.with_model(server.model_name)
    _check_adapter_names(server.served_model_name, _lora_modules(values))
    engine = EngineConfig(
        model=ModelConfig(model=model, **pick(ModelConfig)),
        cache=CacheConfig(**pick(CacheConfig)),
        scheduler=SchedulerConfig(**pick(SchedulerConfig)),
        parallel=ParallelConfig(**{**_parallel_env(env), **pick(ParallelConfig)}),
        speculative=SpeculativeConfig(**pick(SpeculativeConfig)),
        kv_events=kv_events,
        lora=LoRAConfig(**{**pick(LoRAConfig), "lora_modules": _lora_modules(values)}),
    )
    return server, engine


def _model_and_names(model: str, names: tuple[str, ...]) -> tuple[str, tuple[str, ...]]:
    """MODEL and the served names. --served-model-name takes every word up to the next flag, so
    `--served-model-name NAME MODEL` (MODEL after it, as the one-name flag always read it) ends
    with the MODEL: with no MODEL before the flag and several words, the last is the MODEL when
    it names one (a file or folder, a .gguf path, a hub id: resolve.names_a_model); otherwise
    every word is a name and the bundled model serves them (`--served-model-name a b`). An
    empty last word is an empty MODEL, the bundled one (the Helm chart ends its list so)."""
    if model or len(names) < 2 or not (names[-1] == "" or names_a_model(names[-1])):
        return model, names
    return names[-1], names[:-1]


def _check_adapter_names(
    served: tuple[str, ...], lora_modules: tuple[tuple[str, str], ...]
) -> None:
    """An adapter named like the model would never run: a request naming it gets the base."""
    taken = sorted({name for name, _ in lora_modules} & set(served))
    if taken:
        raise ValueError(f"lora_modules: {', '.join(taken)} is also a --served-model-name")


def models_from_args(args: argparse.Namespace) -> ModelsConfig:
    """--models-dir, --models-config and the pool's limits; raises ValueError naming a bad
    field or a flag that does not go with them."""
    values = vars(args)
    models = ModelsConfig(
        **{n: values[n] for c, n, _ in _FLAGS if c is ModelsConfig and values.get(n) is not None}
    )
    if models.catalog and (args.model or values.get("served_model_name")):
        raise ValueError("--models-dir / --models-config name the models: give no MODEL and no "
                         "--served-model-name with them")  # fmt: skip
    return models


def _parallel_env(env: Mapping[str, str]) -> dict[str, Any]:
    """ParallelConfig fields from the environment (flags override them)."""
    values: dict[str, Any] = {}
    for name, (kind, keys) in _PARALLEL_ENV.items():
        key = next((k for k in keys if env.get(k)), None)
        if key is not None:
            try:
                values[name] = kind(env[key])
            except ValueError:
                raise ValueError(f"{name}: environment {key}={env[key]!r} is not valid") from None
    return values


@cache
def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each dataclass field, keyed by field name (reused as CLI help)."""
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, nxt in zip(body, body[1:], strict=False):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[node.target.id] = " ".join(nxt.value.value.split())
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in docs.items() if k in names}
