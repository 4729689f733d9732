"""Routes are thin: parse and validate the body, call one service method, return its response."""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from pagedserve import __version__
from pagedserve.openai_compat.chat.serving import chat_chars, chat_token_ids
from pagedserve.openai_compat.common import errors
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
from pagedserve.openai_compat.lora.protocol import LoadLoRAAdapterRequest, UnloadLoRAAdapterRequest
from pagedserve.openai_compat.lora.serving import DISABLED, load_adapter, unload_adapter
from pagedserve.openai_compat.messages.errors import anthropic_error
from pagedserve.openai_compat.messages.protocol import CountTokensRequest, MessagesRequest
from pagedserve.openai_compat.model_cards import model_cards
from pagedserve.openai_compat.openapi import openapi_document
from pagedserve.openai_compat.rerank.protocol import RerankRequest, ScoreRequest
from pagedserve.openai_compat.rerank.serving import scoring_only
from pagedserve.openai_compat.responses.protocol import ResponsesRequest
from pagedserve.openai_compat.responses.serving import ResponsesService
from pagedserve.openai_compat.state import ServerState

Body = TypeVar("Body", bound=BaseModel)


def _state(request: Request) -> ServerState:
    state = request.app.state.server
    assert isinstance(state, ServerState)  # create_app put it there
    return state


@endpoint
async def chat(request: Request) -> Response:
    state = _state(request)
    state.available()
    body = await parse(request, ChatCompletionRequest, state.config.max_body_bytes)
    async with state.serving(body.model) as model:
        _generating(model.ctx, "/v1/chat/completions")
        return await model.chat.create(body, request.receive)


@endpoint
async def completions(request: Request) -> Response:
    state = _state(request)
    state.available()
    body = await parse(request, CompletionRequest, state.config.max_body_bytes)
    async with state.serving(body.model) as model:
        _generating(model.ctx, "/v1/completions")
        return await model.completion.create(body, request.receive)


@endpoint
async def infill(request: Request) -> Response:
    """llama.cpp's code infill (input_prefix, input_suffix, input_extra)."""
    state = _state(request)
    state.available()
    body = await parse(request, InfillRequest, state.config.max_body_bytes)
    async with state.serving(body.model) as model:
        _generating(model.ctx, "/infill")
        return await model.infill.create(body, request.receive)


@endpoint
async def embeddings(request: Request) -> Response:
    state = _state(request)
    state.available()
    body = await parse(request, EmbeddingRequest, state.config.max_body_bytes)
    async with state.serving(body.model) as model:
        return await model.embeddings.create(body, request.receive)


@endpoint
async def rerank(request: Request) -> Response:
    """Cohere's and Jina's rerank (/v1/rerank; /v2/rerank for Cohere's v2 client)."""
    state = _state(request)
    state.available()
    body = await parse(request, RerankRequest, state.config.max_body_bytes)
    async with state.serving(body.model) as model:
        model.ctx.check_model(body.model)
        return await model.rerank.rerank(body, request.receive)


@endpoint
async def score(request: Request) -> Response:
    """vLLM's score: text_1 against text_2."""
    state = _state(request)
    state.available()
    body = await parse(request, ScoreRequest, state.config.max_body_bytes)
    async with state.serving(body.model) as model:
        model.ctx.check_model(body.model)
        return await model.rerank.score(body, request.receive)


@endpoint
async def responses(request: Request) -> Response:
    state = _state(request)
    state.available()
    body = await parse(request, ResponsesRequest, state.config.max_body_bytes)
    async with state.serving(body.model) as model:
        _generating(model.ctx, "/v1/responses")
        return await model.responses.create(body, request.receive)


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
    state.available()
    body = await parse(request, MessagesRequest, state.config.max_body_bytes)
    async with state.serving(body.model) as model:
        _generating(model.ctx, "/v1/messages")
        return await model.messages.create(body, request.receive)


@endpoint_in(anthropic_error)
async def count_message_tokens(request: Request) -> Response:
    state = _state(request)
    state.available()
    body = await parse(request, CountTokensRequest, state.config.max_body_bytes)
    async with state.serving(body.model) as model:
        return JSONResponse(await model.messages.count_tokens(body))


def _stored_response(request: Request) -> tuple[ResponsesService, str]:
    response_id = request.path_params["response_id"]
    return _state(request).responses_holding(response_id), response_id


def _generating(ctx: ServingContext, route: str) -> None:
    """A 400 naming the task when the server embeds or scores rather than generates."""
    if ctx.engine.model_info.task == "embed":
        raise embedding_only(ctx.model_name, route)
    if ctx.engine.model_info.task == "score":
        raise scoring_only(ctx.model_name, route)


@endpoint
async def models(request: Request) -> Response:
    return JSONResponse({"object": "list", "data": model_cards(_state(request))})


@endpoint
async def model(request: Request) -> Response:
    state = _state(request)
    name = request.path_params["model"]
    card = next((c for c in model_cards(state) if c["id"] == name), None)
    if card is None:
        raise errors.model_not_found(name)
    return JSONResponse(card)


@endpoint
async def load_lora_adapter(request: Request) -> Response:
    state, body = await _lora_body(request, LoadLoRAAdapterRequest)
    async with state.serving(body.model) as served:
        return await load_adapter(served.ctx.engine, body.lora_name, body.lora_path)


@endpoint
async def unload_lora_adapter(request: Request) -> Response:
    state, body = await _lora_body(request, UnloadLoRAAdapterRequest)
    async with state.serving(body.model) as served:
        return await unload_adapter(served.ctx.engine, body.lora_name)


async def _lora_body(request: Request, model: type[Body]) -> tuple[ServerState, Body]:
    """The adapter routes' body, once runtime updating is allowed (400 otherwise)."""
    state = _state(request)
    state.available()
    body = await parse(request, model, state.config.max_body_bytes)
    if not state.config.allow_runtime_lora_updating:
        raise errors.invalid(DISABLED)
    return state, body


@endpoint
async def tokenize(request: Request) -> Response:
    state = _state(request)
    state.available()
    body = await parse(request, TokenizeRequest, state.config.max_body_bytes)
    async with state.serving(body.model) as served:
        return await _tokenize(served.ctx, body)


async def _tokenize(ctx: ServingContext, body: TokenizeRequest) -> Response:
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
    state.available()
    body = await parse(request, DetokenizeRequest, state.config.max_body_bytes)
    async with state.serving(body.model) as served:
        tokenizer = served.ctx.engine.tokenizer
        served.ctx.check_model(body.model)
        require_in_vocabulary(body.tokens, tokenizer.vocab_size, "tokens")
        return JSONResponse({"prompt": tokenizer.decode(body.tokens)})


@endpoint
async def health(request: Request) -> Response:
    return JSONResponse(_state(request).health())


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
    Route("/v1/load_lora_adapter", load_lora_adapter, methods=["POST"]),
    Route("/v1/unload_lora_adapter", unload_lora_adapter, methods=["POST"]),
    Route("/tokenize", tokenize, methods=["POST"]),
    Route("/detokenize", detokenize, methods=["POST"]),
    Route("/health", health, methods=["GET"]),
    Route("/metrics", metrics, methods=["GET"]),
    Route("/version", version, methods=["GET"]),
    Route("/openapi.json", openapi, methods=["GET"]),
]
"""Every route reads the app's ServerState from `request.app.state.server`."""
