"""Anthropic's error envelope, `{"type": "error", "error": {"type", "message"}}`, and its
status codes, for every error the Messages routes raise (the same APIError the OpenAI routes
raise, rendered in the other API's words).

A full waiting queue (429 queue_full on the OpenAI side) is the server being out of room, which
Anthropic calls 529 overloaded_error (its SDK retries it, after Retry-After); the engine loading
or stopped stays 503 (as /health says), as api_error. A client mistake is always a 4xx.
"""

from __future__ import annotations

from typing import Any

from pagedserve.openai_compat.common.errors import APIError
from pagedserve.openai_compat.common.http_responses import JSONResponse

OVERLOADED = 529
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    OVERLOADED: "overloaded_error",
}
"""Anthropic's error type per status; any other 4xx is invalid_request_error, 5xx api_error."""
PATH_PREFIX = "/v1/messages"
"""Every route that answers in Anthropic's envelope lives here."""


def status_of(exc: APIError) -> int:
    return OVERLOADED if exc.code == "queue_full" else exc.status


def error_body(exc: APIError) -> dict[str, Any]:
    status = status_of(exc)
    kind = ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": exc.message}}


def anthropic_error(exc: APIError) -> JSONResponse:
    return JSONResponse(error_body(exc), status_code=status_of(exc), headers=exc.headers)
