"""GET /openapi.json: the request bodies' JSON schemas, generated from the pydantic models."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from pagedserve import __version__
from pagedserve.openai_compat.common.protocol import REQUEST_MODELS
from pagedserve.openai_compat.embeddings.protocol import EmbeddingRequest
from pagedserve.openai_compat.infill.protocol import InfillRequest
from pagedserve.openai_compat.lora.protocol import LORA_REQUEST_MODELS
from pagedserve.openai_compat.messages.protocol import MESSAGES_REQUEST_MODELS
from pagedserve.openai_compat.rerank.protocol import RERANK_REQUEST_MODELS
from pagedserve.openai_compat.responses.protocol import RESPONSES_REQUEST_MODELS

ROUTE_MODELS: dict[str, type[BaseModel]] = {
    **REQUEST_MODELS,
    "/v1/embeddings": EmbeddingRequest,
    "/infill": InfillRequest,
    **RESPONSES_REQUEST_MODELS,
    **MESSAGES_REQUEST_MODELS,
    **RERANK_REQUEST_MODELS,
    **LORA_REQUEST_MODELS,
}
"""The request body of every POST route (protocol.py's and the newer modules')."""

_REF = "#/components/schemas/{model}"
_ERROR_SCHEMA = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}
_ANTHROPIC_ERROR_SCHEMA = {
    "type": "object",
    "required": ["type", "error"],
    "properties": {
        "type": {"const": "error"},
        "error": {
            "type": "object",
            "required": ["type", "message"],
            "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
        },
    },
}
"""The Messages routes' errors (Anthropic's envelope)."""
_GET_PATHS = ("/v1/models", "/health", "/metrics", "/version")
_RESPONSE_ID = [
    {
        "name": "response_id",
        "in": "path",
        "required": True,
        "schema": {"type": "string", "pattern": "^resp_[0-9a-f]{48}$"},
    }
]
_STORED_RESPONSE_PATHS = {
    "/v1/responses/{response_id}": ("get", "delete"),
    "/v1/responses/{response_id}/cancel": ("post",),
    "/v1/responses/{response_id}/input_items": ("get",),
}
"""Routes on a stored response: no body, the id in the path."""


def _responses(path: str = "") -> dict[str, Any]:
    name = "AnthropicError" if path in MESSAGES_REQUEST_MODELS else "Error"
    error = {"content": {"application/json": {"schema": {"$ref": _REF.format(model=name)}}}}
    ok = {"description": "OK (JSON, or text/event-stream when stream is true)"}
    return {"200": ok, "4XX": {"description": "Client error", **error}}


@lru_cache(maxsize=1)
def openapi_document() -> dict[str, Any]:
    models = list(ROUTE_MODELS.values())
    _, top = models_json_schema([(m, "validation") for m in models], ref_template=_REF)
    schemas = {**top.get("$defs", {}), "Error": _ERROR_SCHEMA,
               "AnthropicError": _ANTHROPIC_ERROR_SCHEMA}  # fmt: skip
    paths: dict[str, Any] = {}
    for path, model in ROUTE_MODELS.items():
        body = {"$ref": _REF.format(model=model.__name__)}
        paths[path] = {
            "post": {
                "operationId": model.__name__,
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": body}},
                },
                "responses": _responses(path),
            }
        }
    for path in _GET_PATHS:
        paths[path] = {"get": {"responses": {"200": {"description": "OK"}}}}
    for path, methods in _STORED_RESPONSE_PATHS.items():
        op = {"parameters": _RESPONSE_ID, "responses": _responses()}
        paths[path] = {method: {**op, "operationId": f"{method}_{path}"} for method in methods}
    return {
        "openapi": "3.1.0",
        "info": {"title": "pagedserve", "version": __version__},
        "paths": paths,
        "components": {"schemas": schemas},
    }
