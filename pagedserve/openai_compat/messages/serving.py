"""POST /v1/messages and /v1/messages/count_tokens (Anthropic's Messages API) on the chat
machinery.

A Messages request becomes a chat request (`input.chat_request`), which ChatService prepares as
it prepares its own: template, tools, grammar, reasoning, images (an image's error names its
block, `messages[i].content[j]`). The answer is shaped as Anthropic's
Message, or streamed as its events (`events.BlockBuilder`). Every exit path closes the engine
stream (the chat helpers do it in `finally`), which aborts the request and frees its pages.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from starlette.responses import Response
from starlette.types import Receive

from pagedserve.core.engine_client import RequestStream
from pagedserve.core.outputs import RequestOutput
from pagedserve.openai_compat.chat.output import OutputPlan
from pagedserve.openai_compat.chat.serving import ChatService, Prepared, chat_chars
from pagedserve.openai_compat.common import errors
from pagedserve.openai_compat.common.http_responses import JSONResponse
from pagedserve.openai_compat.common.media import image_parts, load_message_images
from pagedserve.openai_compat.common.protocol import ChatCompletionRequest
from pagedserve.openai_compat.common.serving import (
    OFF_LOOP_CHARS,
    ServingContext,
    collect,
    engine_errors,
    off_loop,
    sampling_params,
    stream_outputs,
)
from pagedserve.openai_compat.common.streaming import SSEResponse, until_disconnect
from pagedserve.openai_compat.common.structured import compile_off_loop
from pagedserve.openai_compat.messages.errors import error_body
from pagedserve.openai_compat.messages.events import (
    BlockBuilder,
    Event,
    event_frame,
    message_object,
    new_id,
    stop_reason,
    usage,
)
from pagedserve.openai_compat.messages.input import chat_request, image_blocks
from pagedserve.openai_compat.messages.protocol import CountTokensRequest, MessagesRequest

logger = logging.getLogger("pagedserve.server")


@dataclass
class _Run:
    """One message being generated."""

    message_id: str
    stream: RequestStream
    plan: OutputPlan
    num_prompt: int
    stops: list[str]


class MessagesService:
    def __init__(self, ctx: ServingContext) -> None:
        self.ctx = ctx
        self.chat = ChatService(ctx)

    async def create(self, req: MessagesRequest, receive: Receive) -> Response:
        run = await self._start(req)
        if req.stream:
            return SSEResponse(self._frames(run))
        work = collect([run.stream], self.ctx.metrics, "messages")
        [final] = await until_disconnect(receive, work)
        return JSONResponse(self._message(run, final))

    async def count_tokens(self, req: CountTokensRequest) -> dict[str, int]:
        """The prompt's tokens as /v1/messages would render them (template, tools)."""
        _, prep = await self._prepare(req)
        return {"input_tokens": len(prep.prompt_ids)}

    async def _prepare(self, req: CountTokensRequest) -> tuple[ChatCompletionRequest, Prepared]:
        self.ctx.check_model(req.model)
        chat = chat_request(req)
        blocks = image_blocks(req.messages)
        parts = dict(zip((param for param, _ in image_parts(chat.messages)), blocks, strict=True))
        try:
            images = await load_message_images(chat.messages, self.ctx.engine, self.ctx.media)
            # images: resized and patched on a worker thread
            chars = chat_chars(chat.messages) + (OFF_LOOP_CHARS if images else 0)
            return chat, await off_loop(chars, self.chat.prepare, chat, images)
        except errors.APIError as exc:
            block = parts.get(exc.param or "")
            if block is not None:  # chat's image part: name the Messages block
                exc.param, exc.message = block, f"{block}: {exc.message}"
            raise

    async def _start(self, req: MessagesRequest) -> _Run:
        """Everything that can refuse the request, before any header is sent."""
        ctx = self.ctx.for_model(req.model)  # an adapter's name runs that adapter
        chat, prep = await self._prepare(req)
        await compile_off_loop(ctx.engine, prep.spec)
        skip = False if prep.keep_special_tokens else None
        vocab_size = ctx.engine.tokenizer.vocab_size
        params = sampling_params(chat, req.max_tokens, None, None, vocab_size, prep.spec, skip)
        ctx.admit(prep.text_ids or prep.prompt_ids, "messages")
        message_id = new_id("msg")
        [stream] = ctx.start(message_id, [prep.prompt_ids], params, "messages", prep.multimodal)
        stops = list(req.stop_sequences or ())
        return _Run(message_id, stream, prep.output, len(prep.prompt_ids), stops)

    def _message(self, run: _Run, out: RequestOutput) -> dict[str, Any]:
        [o] = out.outputs
        builder = BlockBuilder()
        builder.feed(run.plan.new_choice().feed(o.text, final=True))
        content = builder.finish()
        stop = stop_reason(o.finish_reason, o.stop_reason, builder.num_tool_uses, run.stops)
        cached = out.metrics.num_cached_tokens if out.metrics else 0
        message = message_object(run.message_id, self.ctx.model_name, content, stop)
        return {**message, "usage": usage(run.num_prompt, len(o.token_ids), cached)}

    async def _frames(self, run: _Run) -> AsyncIterator[bytes]:
        """message_start, ping, the blocks' events, message_delta, message_stop; a failure
        after the headers went out is an `error` event, as Anthropic streams it."""
        start = message_object(run.message_id, self.ctx.model_name, [], (None, None))
        start["usage"] = usage(run.num_prompt, 0, 0)
        yield event_frame({"type": "message_start", "message": start})
        yield event_frame({"type": "ping"})
        events = self._events(run)
        try:
            async for event in events:
                yield event_frame(event)
        except errors.APIError as exc:
            yield event_frame(error_body(exc))
        except Exception:
            logger.exception("message %s failed while streaming", run.message_id)
            yield event_frame(error_body(errors.internal(run.message_id)))
        finally:
            await events.aclose()  # type: ignore[attr-defined]

    async def _events(self, run: _Run) -> AsyncIterator[Event]:
        parser, builder = run.plan.new_choice(), BlockBuilder()
        num_output, cached, reason, matched = 0, 0, None, None
        outputs = stream_outputs([run.stream], self.ctx.metrics)
        try:
            with engine_errors("messages"):
                async for _, out in outputs:
                    cached = out.metrics.num_cached_tokens if out.metrics else cached
                    for o in out.outputs:
                        num_output += len(o.token_ids)
                        reason, matched = o.finish_reason or reason, o.stop_reason or matched
                        builder.feed(parser.feed(o.text, final=o.finish_reason is not None))
                    for event in builder.take():
                        yield event
        finally:
            await outputs.aclose()  # type: ignore[attr-defined]
        builder.finish()
        for event in builder.take():
            yield event
        stop = stop_reason(reason, matched, builder.num_tool_uses, run.stops)
        delta = {"stop_reason": stop[0], "stop_sequence": stop[1]}
        yield {"type": "message_delta", "delta": delta,
               "usage": usage(run.num_prompt, num_output, cached)}  # fmt: skip
        yield {"type": "message_stop"}
