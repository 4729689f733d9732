"""`pagedserve serve [MODEL]`: argv and env -> frozen configs -> hypercorn serving the app.

This is the only module that reads argv or the environment, but for PAGEDSERVE_MAX_CPU_ISA,
which ops/cpu_features.py reads so that the cap holds in child processes and tests too. Flag help
comes from the config dataclasses' field docstrings, so the two never disagree.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import logging
import os
import signal
import sys
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import MISSING, fields
from functools import partial
from typing import TYPE_CHECKING, Any

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
    field_docs,
)
from pagedserve.core.engine_client import EngineClient
from pagedserve.openai_compat.model_catalog import GIB, ModelsConfig, read_catalog
from pagedserve.openai_compat.server_config import (
    REASONING_PARSERS,
    TOOL_CALL_PARSERS,
    ServerConfig,
    parse_mm_limit,
)

if TYPE_CHECKING:
    from pagedserve.openai_compat.model_pool import ModelSpec, PoolLimits

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
    (ServerConfig, "served_model_name", {}),
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
    parser = argparse.ArgumentParser(prog="pagedserve", description=__doc__.splitlines()[0])
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
    server_values["allowed_origins"] = tuple(server_values.get("allowed_origins", ()))
    server = ServerConfig(**server_values)
    engine = EngineConfig(
        model=ModelConfig(model=args.model, **pick(ModelConfig)),
        cache=CacheConfig(**pick(CacheConfig)),
        scheduler=SchedulerConfig(**pick(SchedulerConfig)),
        parallel=ParallelConfig(**{**_parallel_env(env), **pick(ParallelConfig)}),
        speculative=SpeculativeConfig(**pick(SpeculativeConfig)),
        kv_events=KVEventsConfig.from_json(values.get("kv_events_config") or "{}"),
        lora=LoRAConfig(**{**pick(LoRAConfig), "lora_modules": _lora_modules(values)}),
    )
    return server, engine


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


def _url(config: ServerConfig) -> str:
    host = f"[{config.host}]" if ":" in config.host else config.host
    return f"http://{host}:{config.port}"


def _announce(config: ServerConfig, engine: EngineClient) -> None:
    model = engine.model_info
    name = config.served_model_name or model.name
    tokens = model.num_pages * model.page_size
    kv = f" in {model.kv_cache_dtype}" if model.kv_cache_dtype else ""
    print(
        f"pagedserve: serving {name} at {_url(config)}/v1 (KV cache: {model.num_pages} pages x "
        f"{model.page_size} tokens = {tokens} tokens{kv}; max_model_len {model.max_model_len}; "
        f"{'' if model.batch_invariant else 'not '}batch-invariant; weights: {model.weights}; "
        f"speculative decoding: {model.speculative})",
        file=sys.stderr,
        flush=True,
    )


async def run_server(
    server: ServerConfig, engine_config: EngineConfig, models: ModelsConfig | None = None
) -> int:
    """Serve until SIGTERM/SIGINT (then drain in-flight requests) or a failed model load."""
    from hypercorn.asyncio import serve
    from hypercorn.config import Config

    from pagedserve.openai_compat.app import create_app

    stop = asyncio.Event()
    exit_code = 0

    def fatal(exc: BaseException) -> None:
        nonlocal exit_code
        exit_code = 1
        stop.set()

    models = models or ModelsConfig()
    specs, limits = _pool(engine_config, models)
    app = create_app(
        server,
        None if specs else partial(_load_engine, engine_config),
        on_ready=partial(_announce, server),
        on_fatal=fatal,
        models=specs,
        limits=limits,
    )
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    config = Config()
    config.bind = [_url(server).removeprefix("http://")]
    config.graceful_timeout = server.graceful_timeout
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")  # through our handlers, printed once
    config.loglevel = server.log_level.upper()
    if specs:
        print(f"pagedserve: {len(specs)} models at {_url(server)}/v1 (each loads on its first "
              f"request): {', '.join(s.name for s in specs)}", file=sys.stderr, flush=True)  # fmt: skip
    else:
        print(f"pagedserve: loading the model; {_url(server)}/health answers 200 when ready",
              file=sys.stderr, flush=True)  # fmt: skip
    await serve(app, config, shutdown_trigger=stop.wait)  # type: ignore[arg-type]
    if app.state.server.engine is None:
        # Stopped while the model was loading (or after a failed load): the loading thread is
        # inside native code and cannot be interrupted, so leave without waiting for it.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(exit_code)
    return exit_code


def _load_engine(config: EngineConfig) -> EngineClient:
    from pagedserve.core.engine.async_engine import AsyncEngine

    return AsyncEngine.from_config(config)


def _pool(engine: EngineConfig, models: ModelsConfig) -> tuple[list[ModelSpec], PoolLimits]:
    """The catalog's models as the pool's specs (none without --models-dir / --models-config)
    and the pool's limits."""
    from pagedserve.openai_compat.model_pool import ModelSpec, PoolLimits

    limits = PoolLimits(
        max_loaded=models.max_loaded_models,
        memory_bytes=int(models.models_memory * GIB),
        idle_unload=models.idle_unload,
    )
    if not models.catalog:
        return [], limits
    specs = []
    for m in read_catalog(models, engine):
        load = partial(_load_engine, m.engine)
        specs.append(ModelSpec(m.name, load, m.engine.model.model, m.memory_bytes, m.preload))
    return specs, limits


def configure_logging(config: ServerConfig) -> None:
    """One handler on the root logger; every line carries its request's X-Request-Id ("-"
    outside a request). The access log, when asked, prints whatever the log level."""
    from pagedserve.openai_compat.common.request_log import RequestIdFilter, access_logger

    logging.basicConfig(
        level=config.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s [%(request_id)s]: %(message)s",
    )
    for handler in logging.getLogger().handlers:
        handler.addFilter(RequestIdFilter())
    if config.access_log:
        access_logger.setLevel(logging.INFO)


_M_ARENA_MAX = -8  # glibc's mallopt parameter number
MALLOC_ARENAS = 2


def limit_malloc_arenas(arenas: int = MALLOC_ARENAS) -> bool:
    """Cap glibc's malloc arenas before the server starts its threads (an explicit
    MALLOC_ARENA_MAX in the environment wins). glibc gives each allocating thread its own arena,
    up to 8 per core (engine loop, tokenizer and worker threads, torch's OpenMP team), and memory
    freed in one arena is not reused by the others: resident memory crept from wave to wave of
    256 streams; capped, it stays within what RELIABILITY.md promises (figures in
    bench/RESULTS.md)."""
    if "MALLOC_ARENA_MAX" in os.environ or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc (musl has no arenas to cap)
        return False
    return bool(libc.mallopt(_M_ARENA_MAX, arenas))


def _run(coro: Coroutine[object, object, int]) -> int:
    """On uvloop (a dependency except on Windows, where asyncio's own loop runs)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    code: int = uvloop.run(coro)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        server, engine = configs_from_args(args, os.environ)
        models = models_from_args(args)
        if models.catalog:
            read_catalog(models, engine)  # a bad folder or file: the usage error, now
    except ValueError as exc:
        parser.error(str(exc))
    configure_logging(server)
    if engine.parallel.node_rank != 0:  # another node of a tensor-parallel engine
        from pagedserve.node import run_node

        return run_node(engine)
    limit_malloc_arenas()
    return _run(run_server(server, engine, models))


if __name__ == "__main__":
    sys.exit(main())
