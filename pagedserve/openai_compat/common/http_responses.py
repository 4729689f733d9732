"""Plain responses: orjson bodies, OpenAI's error envelope, and the wrapper that turns a
handler's errors into them."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from pagedserve.openai_compat.common import errors
from pagedserve.openai_compat.common.request_log import current_request_id
from pagedserve.openai_compat.common.streaming import ClientGone

logger = logging.getLogger("pagedserve.server")
Endpoint = Callable[[Request], Awaitable[Response]]
CLIENT_CLOSED = 499  # nginx's "client closed request": nobody reads it, but logs show why


class JSONResponse(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


def error_response(exc: errors.APIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


def endpoint(fn: Endpoint) -> Endpoint:
    """API errors become OpenAI envelopes; anything else is a logged 500."""
    return endpoint_in(error_response)(fn)


def endpoint_in(render: Callable[[errors.APIError], Response]) -> Callable[[Endpoint], Endpoint]:
    """`endpoint` for an API with its own error envelope (`render` shapes each APIError)."""

    def wrap(fn: Endpoint) -> Endpoint:
        async def wrapped(request: Request) -> Response:
            try:
                return await fn(request)
            except errors.APIError as exc:
                return render(exc)
            except ClientGone:
                return Response(status_code=CLIENT_CLOSED)
            except Exception:
                request_id = current_request_id.get()
                logger.exception("request %s %s failed", request_id, request.url.path)
                return render(errors.internal(request_id))

        return wrapped

    return wrap
