"""`pagedserve serve [MODEL]`: argv and env -> frozen configs -> hypercorn serving the app.

cli_args.py turns argv and the environment into the frozen configs; this module starts the
engine (or the model pool), the app and hypercorn, and owns the process: logging, signals,
glibc's malloc arenas.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import signal
import sys
from collections.abc import Coroutine, Sequence
from functools import partial
from typing import TYPE_CHECKING

from pagedserve.cli_args import build_parser, configs_from_args, models_from_args
from pagedserve.core.config import EngineConfig
from pagedserve.core.engine_client import EngineClient
from pagedserve.openai_compat.model_catalog import GIB, ModelsConfig, read_catalog
from pagedserve.openai_compat.server_config import ServerConfig

if TYPE_CHECKING:
    from pagedserve.openai_compat.model_pool import ModelSpec, PoolLimits


def _url(config: ServerConfig) -> str:
    host = f"[{config.host}]" if ":" in config.host else config.host
    return f"http://{host}:{config.port}"


def _announce(config: ServerConfig, engine: EngineClient) -> None:
    model = engine.model_info
    name = config.model_name or model.name
    if len(config.served_model_name) > 1:
        name += f" (also as {', '.join(config.served_model_name[1:])})"
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
