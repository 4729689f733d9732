"""POST /v1/chat/completions: template, tokenize, generate, shape as OpenAI's chat objects."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from starlette.responses import Response
from starlette.types import Receive

from pagedserve.core.outputs import RequestOutput
from pagedserve.openai_compat import errors
from pagedserve.openai_compat.logprobs import chat_logprobs
from pagedserve.openai_compat.protocol import ChatCompletionRequest, ChatMessage
from pagedserve.openai_compat.responses import JSONResponse
from pagedserve.openai_compat.serving_common import (
    ServingContext,
    collect,
    engine_errors,
    new_id,
    now,
    off_loop,
    sampling_params,
    stream_outputs,
    usage,
)
from pagedserve.openai_compat.streaming import SSEResponse, sse_frames, until_disconnect


def render_chat(
    ctx: ServingContext, messages: list[ChatMessage], add_generation_prompt: bool
) -> str:
    template = ctx.engine.chat_template
    if template is None:
        raise errors.invalid(
            "This model has no chat template; start the server with --chat-template or use "
            "/v1/completions.",
            param="messages",
        )
    plain = [{"role": m.role, "content": m.text()} for m in messages]
    try:
        return template.render(plain, add_generation_prompt=add_generation_prompt)
    except ValueError as exc:  # ChatTemplateError: e.g. roles in an order the template refuses
        raise errors.invalid(f"Chat template error: {exc}", param="messages") from exc


def chat_chars(messages: list[ChatMessage]) -> int:
    return sum(len(m.text()) for m in messages)


def chat_token_ids(
    ctx: ServingContext, messages: list[ChatMessage], add_generation_prompt: bool
) -> list[int]:
    text = render_chat(ctx, messages, add_generation_prompt)
    return ctx.engine.tokenizer.encode(text, add_special_tokens=False)


class ChatService:
    def __init__(self, ctx: ServingContext) -> None:
        self.ctx = ctx

    async def create(self, req: ChatCompletionRequest, receive: Receive) -> Response:
        ctx = self.ctx
        ctx.check_model(req.model)
        tokenizer = ctx.engine.tokenizer
        prompt_ids = await off_loop(
            chat_chars(req.messages), chat_token_ids, ctx, req.messages, req.add_generation_prompt
        )
        top_k = (req.top_logprobs or 0) if req.logprobs else None
        params = sampling_params(req, req.output_limit(), top_k, None, tokenizer.vocab_size)
        ctx.admit(prompt_ids, params, "messages")
        request_id = new_id("chatcmpl")
        head = ctx.header(request_id, "chat.completion", now())
        [stream] = ctx.start(request_id, [prompt_ids], params, "messages")
        if req.stream:
            chunks = self._chunks(head, stream, params.n, top_k, req.include_usage())
            return SSEResponse(sse_frames(chunks, request_id))
        final = await until_disconnect(receive, collect([stream], ctx.metrics, "messages"))
        return JSONResponse(self._response(head, final[0], top_k))

    def _response(
        self, head: dict[str, Any], out: RequestOutput, top_k: int | None
    ) -> dict[str, Any]:
        tokenizer = self.ctx.engine.tokenizer
        choices = []
        for o in out.outputs:
            logprobs = None
            if top_k is not None:
                logprobs = chat_logprobs(tokenizer, o.logprobs or [], top_k)
            choices.append(
                {
                    "index": o.index,
                    "message": {"role": "assistant", "content": o.text, "refusal": None},
                    "logprobs": logprobs,
                    "finish_reason": o.finish_reason,
                }
            )
        generated = sum(len(o.token_ids) for o in out.outputs)
        cached = out.metrics.num_cached_tokens if out.metrics else 0
        return {
            **head,
            "choices": choices,
            "usage": usage(len(out.prompt_token_ids), generated, cached),
        }

    async def _chunks(
        self,
        head: dict[str, Any],
        stream: AsyncIterator[RequestOutput],
        n: int,
        top_k: int | None,
        include_usage: bool,
    ) -> AsyncIterator[dict[str, Any]]:
        head = {**head, "object": "chat.completion.chunk"}
        if include_usage:
            head["usage"] = None
        tokenizer = self.ctx.engine.tokenizer
        for index in range(n):
            role = {"role": "assistant", "content": ""}
            yield {**head, "choices": [_choice(index, role, None, None)]}
        num_prompt, num_generated, cached = 0, 0, 0
        with engine_errors("messages"):
            async for _, out in stream_outputs([stream], self.ctx.metrics):
                num_prompt = len(out.prompt_token_ids)
                cached = out.metrics.num_cached_tokens if out.metrics else cached
                for o in out.outputs:
                    num_generated += len(o.token_ids)
                    if not (o.text or o.finish_reason or o.logprobs):
                        continue
                    logprobs = None
                    if top_k is not None:
                        logprobs = chat_logprobs(tokenizer, o.logprobs or [], top_k)
                    delta = {"content": o.text} if o.text else {}
                    choice = _choice(o.index, delta, logprobs, o.finish_reason)
                    yield {**head, "choices": [choice]}
        if include_usage:
            yield {**head, "choices": [], "usage": usage(num_prompt, num_generated, cached)}


def _choice(
    index: int, delta: dict[str, Any], logprobs: dict[str, Any] | None, finish_reason: str | None
) -> dict[str, Any]:
    return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
