"""X-Request-Id on every response and every log line of a request, and the optional access log.

The client's `X-Request-Id` is kept when it is printable ASCII of at most 128 characters;
otherwise (or when absent) the server makes one. It is echoed in the response headers, errors
included, and set in a context variable that asyncio copies into every task the request
starts, so `RequestIdFilter` stamps it on each log record emitted while serving it.
"""

from __future__ import annotations

import logging
import re
import secrets
import time
from contextvars import ContextVar

from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

HEADER = "X-Request-Id"
NO_REQUEST = "-"
_ACCEPTED = re.compile(r"[\x21-\x7e]{1,128}")

current_request_id: ContextVar[str] = ContextVar("pagedserve_request_id", default=NO_REQUEST)
access_logger = logging.getLogger("pagedserve.access")


def request_id_of(scope: Scope) -> str:
    """The client's id when acceptable, else a new one."""
    given = Headers(scope=scope).get(HEADER, "")
    return given if _ACCEPTED.fullmatch(given) else secrets.token_hex(16)


class RequestIdFilter(logging.Filter):
    """Adds `record.request_id` (the current request's id, or "-") for the log format."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = current_request_id.get()
        return True


class RequestIdMiddleware:
    """Outermost: every response, a 401 or 404 included, carries the request's id."""

    def __init__(self, app: ASGIApp, access_log: bool = False) -> None:
        self.app = app
        self.access_log = access_log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = request_id_of(scope)
        token = current_request_id.set(request_id)
        status = [0]
        start = time.monotonic()

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message)[HEADER] = request_id
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            if self.access_log:
                _log_access(scope, status[0], time.monotonic() - start)
            current_request_id.reset(token)


def _log_access(scope: Scope, status: int, seconds: float) -> None:
    """One line per request once its response has ended (a stream: after its last frame);
    status 0 means no response was started (the client left first)."""
    client = scope.get("client")
    peer = f"{client[0]}:{client[1]}" if client else "-"
    path = scope.get("path", "")
    access_logger.info('%s "%s %s" %d %.3fs', peer, scope.get("method", ""), path, status, seconds)
