"""Routes are thin: parse and validate the body, call one service method, return its response."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from pagedserve import __version__
from pagedserve.openai_compat import errors
from pagedserve.openai_compat.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from pagedserve.openai_compat.openapi import openapi_document
from pagedserve.openai_compat.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from pagedserve.openai_compat.request_log import current_request_id
from pagedserve.openai_compat.serving_chat import chat_chars, chat_token_ids
from pagedserve.openai_compat.serving_common import off_loop, require_in_vocabulary
from pagedserve.openai_compat.streaming import ClientGone, JSONResponse, error_response

if TYPE_CHECKING:
    from pagedserve.openai_compat.app import ServerState

logger = logging.getLogger("pagedserve.server")
M = TypeVar("M", bound=BaseModel)
Endpoint = Callable[[Request], Awaitable[Response]]
CLIENT_CLOSED = 499  # nginx's "client closed request": nobody reads it, but logs show why


def endpoint(fn: Endpoint) -> Endpoint:
    """API errors become OpenAI envelopes; anything else is a logged 500."""

    async def wrapped(request: Request) -> Response:
        try:
            return await fn(request)
        except errors.APIError as exc:
            return error_response(exc)
        except ClientGone:
            return Response(status_code=CLIENT_CLOSED)
        except Exception:
            request_id = current_request_id.get()
            logger.exception("request %s %s failed", request_id, request.url.path)
            return error_response(errors.internal(request_id))

    return wrapped


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


def _state(request: Request) -> ServerState:
    return request.app.state.server


@endpoint
async def chat(request: Request) -> Response:
    state = _state(request)
    state.ready()
    body = await parse(request, ChatCompletionRequest, state.config.max_body_bytes)
    assert state.chat is not None  # set with ctx, which ready() checked
    return await state.chat.create(body, request.receive)


@endpoint
async def completions(request: Request) -> Response:
    state = _state(request)
    state.ready()
    body = await parse(request, CompletionRequest, state.config.max_body_bytes)
    assert state.completion is not None
    return await state.completion.create(body, request.receive)


@endpoint
async def models(request: Request) -> Response:
    return JSONResponse({"object": "list", "data": [_model_card(_state(request))]})


@endpoint
async def model(request: Request) -> Response:
    state = _state(request)
    state.ready().check_model(request.path_params["model"])
    return JSONResponse(_model_card(state))


@endpoint
async def tokenize(request: Request) -> Response:
    state = _state(request)
    ctx = state.ready()
    body = await parse(request, TokenizeRequest, state.config.max_body_bytes)
    ctx.check_model(body.model)
    if body.messages is not None:
        messages, add_prompt = body.messages, body.add_generation_prompt
        tokens = await off_loop(chat_chars(messages), chat_token_ids, ctx, messages, add_prompt)
    else:
        text = body.prompt or ""
        encode = ctx.engine.tokenizer.encode
        tokens = await off_loop(len(text), encode, text, body.add_special_tokens)
    max_len = ctx.engine.max_model_len
    return JSONResponse({"count": len(tokens), "max_model_len": max_len, "tokens": tokens})


@endpoint
async def detokenize(request: Request) -> Response:
    state = _state(request)
    ctx = state.ready()
    body = await parse(request, DetokenizeRequest, state.config.max_body_bytes)
    ctx.check_model(body.model)
    require_in_vocabulary(body.tokens, ctx.engine.tokenizer.vocab_size, "tokens")
    return JSONResponse({"prompt": ctx.engine.tokenizer.decode(body.tokens)})


@endpoint
async def health(request: Request) -> Response:
    _state(request).ready()
    return JSONResponse({"status": "ok"})


async def metrics(request: Request) -> Response:
    return Response(_state(request).metrics.render(), media_type=METRICS_CONTENT_TYPE)


async def version(request: Request) -> Response:
    return JSONResponse({"version": __version__})


async def openapi(request: Request) -> Response:
    return JSONResponse(openapi_document())


ROUTES = [
    Route("/v1/chat/completions", chat, methods=["POST"]),
    Route("/v1/completions", completions, methods=["POST"]),
    Route("/v1/models", models, methods=["GET"]),
    Route("/v1/models/{model:path}", model, methods=["GET"]),
    Route("/tokenize", tokenize, methods=["POST"]),
    Route("/detokenize", detokenize, methods=["POST"]),
    Route("/health", health, methods=["GET"]),
    Route("/metrics", metrics, methods=["GET"]),
    Route("/version", version, methods=["GET"]),
    Route("/openapi.json", openapi, methods=["GET"]),
]
"""Every route reads the app's ServerState from `request.app.state.server`."""


def _model_card(state: ServerState) -> dict[str, Any]:
    ctx = state.ready()
    return {
        "id": ctx.model_name,
        "object": "model",
        "created": state.started,
        "owned_by": "pagedserve",
        "root": ctx.engine.model_name,
        "parent": None,
        "max_model_len": ctx.engine.max_model_len,
    }
