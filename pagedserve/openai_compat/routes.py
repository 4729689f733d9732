"""Routes are thin: parse and validate the body, call one service method, return its response."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from pagedserve import __version__
from pagedserve.openai_compat.chat.serving import chat_chars, chat_token_ids
from pagedserve.openai_compat.common.http_responses import JSONResponse, endpoint, endpoint_in
from pagedserve.openai_compat.common.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from pagedserve.openai_compat.common.parsing import parse
from pagedserve.openai_compat.common.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from pagedserve.openai_compat.common.serving import (
    ServingContext,
    off_loop,
    require_in_vocabulary,
)
from pagedserve.openai_compat.embeddings.protocol import EmbeddingRequest
from pagedserve.openai_compat.embeddings.serving import embedding_only
from pagedserve.openai_compat.infill.protocol import InfillRequest
from pagedserve.openai_compat.messages.errors import anthropic_error
from pagedserve.openai_compat.messages.protocol import CountTokensRequest, MessagesRequest
from pagedserve.openai_compat.openapi import openapi_document
from pagedserve.openai_compat.rerank.protocol import RerankRequest, ScoreRequest
from pagedserve.openai_compat.rerank.serving import scoring_only
from pagedserve.openai_compat.responses.protocol import ResponsesRequest
from pagedserve.openai_compat.responses.serving import ResponsesService
from pagedserve.openai_compat.state import ServerState


def _state(request: Request) -> ServerState:
    state = request.app.state.server
    assert isinstance(state, ServerState)  # create_app put it there
    return state


@endpoint
async def chat(request: Request) -> Response:
    state = _state(request)
    _generating(state.ready(), "/v1/chat/completions")
    body = await parse(request, ChatCompletionRequest, state.config.max_body_bytes)
    assert state.chat is not None  # set with ctx, which ready() checked
    return await state.chat.create(body, request.receive)


@endpoint
async def completions(request: Request) -> Response:
    state = _state(request)
    _generating(state.ready(), "/v1/completions")
    body = await parse(request, CompletionRequest, state.config.max_body_bytes)
    assert state.completion is not None
    return await state.completion.create(body, request.receive)


@endpoint
async def infill(request: Request) -> Response:
    """llama.cpp's code infill (input_prefix, input_suffix, input_extra)."""
    state = _state(request)
    _generating(state.ready(), "/infill")
    body = await parse(request, InfillRequest, state.config.max_body_bytes)
    assert state.infill is not None
    return await state.infill.create(body, request.receive)


@endpoint
async def embeddings(request: Request) -> Response:
    state = _state(request)
    state.ready()
    body = await parse(request, EmbeddingRequest, state.config.max_body_bytes)
    assert state.embeddings is not None
    return await state.embeddings.create(body, request.receive)


@endpoint
async def rerank(request: Request) -> Response:
    """Cohere's and Jina's rerank (/v1/rerank; /v2/rerank for Cohere's v2 client)."""
    state = _state(request)
    state.ready()
    body = await parse(request, RerankRequest, state.config.max_body_bytes)
    state.ready().check_model(body.model)
    assert state.rerank is not None
    return await state.rerank.rerank(body, request.receive)


@endpoint
async def score(request: Request) -> Response:
    """vLLM's score: text_1 against text_2."""
    state = _state(request)
    state.ready()
    body = await parse(request, ScoreRequest, state.config.max_body_bytes)
    state.ready().check_model(body.model)
    assert state.rerank is not None
    return await state.rerank.score(body, request.receive)


@endpoint
async def responses(request: Request) -> Response:
    state = _state(request)
    _generating(state.ready(), "/v1/responses")
    body = await parse(request, ResponsesRequest, state.config.max_body_bytes)
    assert state.responses is not None
    return await state.responses.create(body, request.receive)


@endpoint
async def response(request: Request) -> Response:
    """GET or DELETE /v1/responses/{response_id}."""
    service, response_id = _stored_response(request)
    if request.method == "DELETE":
        return JSONResponse(service.delete(response_id))
    return JSONResponse(service.retrieve(response_id, dict(request.query_params)))


@endpoint
async def cancel_response(request: Request) -> Response:
    service, response_id = _stored_response(request)
    return JSONResponse(await service.cancel(response_id))


@endpoint
async def response_input_items(request: Request) -> Response:
    service, response_id = _stored_response(request)
    return JSONResponse(service.input_items(response_id, dict(request.query_params)))


@endpoint_in(anthropic_error)
async def messages(request: Request) -> Response:
    state = _state(request)
    _generating(state.ready(), "/v1/messages")
    body = await parse(request, MessagesRequest, state.config.max_body_bytes)
    assert state.messages is not None
    return await state.messages.create(body, request.receive)


@endpoint_in(anthropic_error)
async def count_message_tokens(request: Request) -> Response:
    state = _state(request)
    state.ready()
    body = await parse(request, CountTokensRequest, state.config.max_body_bytes)
    assert state.messages is not None
    return JSONResponse(await state.messages.count_tokens(body))


def _stored_response(request: Request) -> tuple[ResponsesService, str]:
    state = _state(request)
    state.ready()
    assert state.responses is not None  # set with ctx, which ready() checked
    return state.responses, request.path_params["response_id"]


def _generating(ctx: ServingContext, route: str) -> None:
    """A 400 naming the task when the server embeds or scores rather than generates."""
    if ctx.engine.model_info.task == "embed":
        raise embedding_only(ctx.model_name, route)
    if ctx.engine.model_info.task == "score":
        raise scoring_only(ctx.model_name, route)


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
    max_len = ctx.engine.model_info.max_model_len
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
    Route("/infill", infill, methods=["POST"]),
    Route("/v1/embeddings", embeddings, methods=["POST"]),
    Route("/v1/rerank", rerank, methods=["POST"]),
    Route("/v2/rerank", rerank, methods=["POST"]),  # Cohere's v2 client (LangChain's CohereRerank)
    Route("/v1/score", score, methods=["POST"]),
    Route("/v1/responses", responses, methods=["POST"]),
    Route("/v1/responses/{response_id}", response, methods=["GET", "DELETE"]),
    Route("/v1/responses/{response_id}/cancel", cancel_response, methods=["POST"]),
    Route("/v1/responses/{response_id}/input_items", response_input_items, methods=["GET"]),
    Route("/v1/messages", messages, methods=["POST"]),
    Route("/v1/messages/count_tokens", count_message_tokens, methods=["POST"]),
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
        "root": ctx.engine.model_info.name,
        "parent": None,
        "max_model_len": ctx.engine.model_info.max_model_len,
        # Greedy and seeded results depend on the request alone, not the batch (issue 16).
        "batch_invariant": ctx.engine.model_info.batch_invariant,
        # What runs the weights, e.g. GGUF blocks kept quantized on the int8 kernels (issue 12).
        "weights": ctx.engine.model_info.weights,
        # generate (chat, completions), embed (/v1/embeddings, issue 25) or score (/v1/rerank,
        # /v1/score, issue 40).
        "task": ctx.engine.model_info.task,
    }
