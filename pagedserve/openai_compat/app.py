"""The Starlette app. Its lifespan owns the model pool (model_pool.py): loading runs in a worker
thread, so /health answers 503 until the start-up model is ready, and shutdown stops the engines
after hypercorn has drained the requests in flight."""

from __future__ import annotations

import hmac
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from pagedserve.core.engine_client import EngineClient
from pagedserve.openai_compat.common import errors
from pagedserve.openai_compat.common.http_responses import error_response
from pagedserve.openai_compat.common.request_log import HEADER as REQUEST_ID_HEADER
from pagedserve.openai_compat.common.request_log import RequestIdMiddleware
from pagedserve.openai_compat.messages.errors import PATH_PREFIX as MESSAGES_PREFIX
from pagedserve.openai_compat.messages.errors import anthropic_error
from pagedserve.openai_compat.model_pool import ModelSpec, PoolLimits
from pagedserve.openai_compat.routes import ROUTES
from pagedserve.openai_compat.server_config import ServerConfig
from pagedserve.openai_compat.state import ServerState
from pagedserve.openai_compat.ui import OPEN_PREFIX, ui_routes

logger = logging.getLogger("pagedserve.server")

OPEN_PATHS = frozenset({"/health", "/metrics", "/"})
"""Reachable without the API key (probes, Prometheus, the page); so is everything under /ui/."""


class APIKeyMiddleware:
    """401 unless `Authorization: Bearer <key>` or Anthropic's `x-api-key: <key>` matches
    (constant-time compare)."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.expected = api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not _is_open(scope["path"]):
            headers = Headers(scope=scope)
            scheme, _, token = headers.get("authorization", "").partition(" ")
            bearer = token.strip() if scheme.lower() == "bearer" else ""
            keys = (bearer, headers.get("x-api-key", "").strip())
            ok = any(hmac.compare_digest(k.encode(), self.expected) for k in keys if k)
            if not ok:
                render = _renderer(scope["path"])
                await render(errors.invalid_api_key())(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _renderer(path: str) -> Callable[[errors.APIError], Response]:
    """The error envelope of the API a path belongs to: Anthropic's under /v1/messages."""
    return anthropic_error if path.startswith(MESSAGES_PREFIX) else error_response


def _is_open(path: str) -> bool:
    return path in OPEN_PATHS or path.startswith(OPEN_PREFIX)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    api = errors.APIError(exc.status_code, str(exc.detail), type=kind)
    return _renderer(request.url.path)(api)


def create_app(
    config: ServerConfig,
    load_engine: Callable[[], EngineClient] | None,
    on_ready: Callable[[EngineClient], None] | None = None,
    on_fatal: Callable[[BaseException], None] | None = None,
    models: Sequence[ModelSpec] = (),
    limits: PoolLimits | None = None,
) -> Starlette:
    """One model: `load_engine` (blocking, e.g. AsyncEngine.from_config bound to its config),
    loaded at start-up (/health 503 until then; `on_fatal` when it fails). Several (issue 39):
    `models`, each loaded when a request first names it, within `limits`."""
    if models:
        state = ServerState(config, models, limits, catalog=True, on_loaded=on_ready)
    else:
        assert load_engine is not None, "create_app needs load_engine or models"
        spec = ModelSpec(config.model_name or "", load_engine, preload=True)
        state = ServerState(config, [spec], limits, on_loaded=on_ready, on_fatal=on_fatal)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        state.pool.start()
        try:
            yield
        finally:
            await state.shutdown()

    middleware = _middleware(config)
    app = Starlette(
        routes=ROUTES + (ui_routes() if config.ui else []),
        middleware=middleware,
        exception_handlers={HTTPException: _http_error},
        lifespan=lifespan,
    )
    app.state.server = state
    return app


def _middleware(config: ServerConfig) -> list[Middleware]:
    """The request id outermost (every response carries it), then CORS, so browsers'
    preflight requests are answered before the key check."""
    middleware = [Middleware(RequestIdMiddleware, access_log=config.access_log)]
    if config.allowed_origins:
        middleware.append(
            Middleware(
                CORSMiddleware,
                allow_origins=list(config.allowed_origins),
                allow_methods=["*"],
                allow_headers=["*"],
                expose_headers=[REQUEST_ID_HEADER],
            )
        )
    if config.api_key:
        middleware.append(Middleware(APIKeyMiddleware, api_key=config.api_key))
    return middleware
