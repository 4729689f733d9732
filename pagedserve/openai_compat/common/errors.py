"""OpenAI's error envelope: {"error": {"message", "type", "param", "code"}}.

Client mistakes become 4xx here and never reach the engine; 500 is kept for real faults.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from pagedserve.core.sampling_params import SamplingParamsError
from pagedserve.openai_compat.common.protocol import FieldError


class APIError(Exception):
    """An error that maps to one HTTP status and one OpenAI error envelope."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def invalid(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def model_not_found(model: str) -> APIError:
    return APIError(
        404,
        f"The model `{model}` does not exist.",
        param="model",
        code="model_not_found",
    )


def invalid_api_key() -> APIError:
    return APIError(401, "Incorrect API key provided.", code="invalid_api_key")


def too_large(limit: int) -> APIError:
    return APIError(413, f"Request body is larger than {limit} bytes.", code="request_too_large")


def unavailable(message: str) -> APIError:
    return APIError(503, message, type="service_unavailable", code="service_unavailable")


def queue_full(retry_after_s: int = 1) -> APIError:
    return APIError(
        429,
        "The server's waiting queue is full; retry later.",
        type="rate_limit_error",
        code="queue_full",
        headers={"Retry-After": str(retry_after_s)},
    )


def internal(request_id: str) -> APIError:
    return APIError(
        500,
        f"The server had an error while processing request {request_id}.",
        type="server_error",
        code="internal_error",
    )


_TYPE_TAGS = frozenset(
    {"str", "int", "float", "bool", "none", "TextPart", "StreamOptions", "NamedToolChoice"}
)


def _loc_to_param(loc: tuple[int | str, ...]) -> str | None:
    # ("messages", 0, "content") -> "messages[0].content"; union member names are dropped.
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif item in _TYPE_TAGS or "[" in item:
            continue
        else:
            parts.append(("." if parts else "") + item)
    return "".join(parts) or None


def from_validation_error(exc: ValidationError) -> APIError:
    """The first problem pydantic found, with `param` naming the field."""
    first = exc.errors(include_url=False)[0]
    cause = (first.get("ctx") or {}).get("error")
    if isinstance(cause, FieldError):
        return invalid(str(cause), param=cause.param)
    param = _loc_to_param(tuple(first["loc"]))
    if first["type"] == "extra_forbidden":
        return invalid(f"Unrecognized request argument: {param}", param=param)
    message = first["msg"]
    return invalid(f"{param}: {message}" if param else message, param=param)


def from_sampling_error(exc: SamplingParamsError) -> APIError:
    return invalid(str(exc), param=exc.param)
