"""A request body -> its pydantic model, within the size limit; every failure a 4xx."""

from __future__ import annotations

from typing import TypeVar

import orjson
from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from pagedserve.openai_compat.common import errors

M = TypeVar("M", bound=BaseModel)


async def parse(request: Request, model: type[M], limit: int) -> M:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise errors.too_large(limit)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise errors.too_large(limit)
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise errors.invalid(f"The body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise errors.invalid("The body must be a JSON object.")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise errors.from_validation_error(exc) from None
