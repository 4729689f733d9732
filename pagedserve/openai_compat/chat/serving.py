"""POST /v1/chat/completions: template, tokenize, generate, shape as OpenAI's chat objects."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from starlette.responses import Response
from starlette.types import Receive

from pagedserve.core.engine_client import RequestStream
from pagedserve.core.multimodal.inputs import MultiModalInputs, expand_image_tokens
from pagedserve.core.outputs import RequestOutput
from pagedserve.core.sampling_params import StructuredOutputs
from pagedserve.core.tokenizers.chat_template import ChatTemplate
from pagedserve.openai_compat.chat.output import OutputPlan
from pagedserve.openai_compat.chat.reasoning import wants_reasoning
from pagedserve.openai_compat.chat.tools import ToolPlan, plan_tools, template_messages
from pagedserve.openai_compat.common import errors
from pagedserve.openai_compat.common.http_responses import JSONResponse
from pagedserve.openai_compat.common.logprobs import chat_logprobs
from pagedserve.openai_compat.common.media import LoadedImage, load_message_images
from pagedserve.openai_compat.common.protocol import ChatCompletionRequest, ChatMessage
from pagedserve.openai_compat.common.serving import (
    OFF_LOOP_CHARS,
    ServingContext,
    collect,
    engine_errors,
    new_id,
    now,
    off_loop,
    running_usage,
    sampling_params,
    stream_outputs,
    usage,
)
from pagedserve.openai_compat.common.streaming import SSEResponse, sse_frames, until_disconnect
from pagedserve.openai_compat.common.structured import compile_off_loop, structured_outputs


def render_chat(
    ctx: ServingContext,
    messages: list[ChatMessage],
    add_generation_prompt: bool,
    tools: ToolPlan | None = None,
    template_kwargs: dict[str, Any] | None = None,
) -> str:
    template = require_template(ctx)
    plan = tools or ToolPlan(None, "tools" not in template.variables, None, None)
    try:
        return template.render(
            template_messages(messages, plan),
            add_generation_prompt=add_generation_prompt,
            tools=plan.template_tools,
            **(template_kwargs or {}),
        )
    except ValueError as exc:  # ChatTemplateError: e.g. roles in an order the template refuses
        raise errors.invalid(f"Chat template error: {exc}", param="messages") from exc


def require_template(ctx: ServingContext) -> ChatTemplate:
    template = ctx.engine.chat_template
    if template is None:
        raise errors.invalid(
            "This model has no chat template; start the server with --chat-template or use "
            "/v1/completions.",
            param="messages",
        )
    return template


def chat_chars(messages: list[ChatMessage]) -> int:
    return sum(len(m.text()) for m in messages)


def chat_token_ids(
    ctx: ServingContext, messages: list[ChatMessage], add_generation_prompt: bool
) -> list[int]:
    text = render_chat(ctx, messages, add_generation_prompt)
    return ctx.engine.tokenizer.encode(text, add_special_tokens=False)


@dataclass
class Prepared:
    prompt_ids: list[int]
    spec: StructuredOutputs | None
    output: OutputPlan
    keep_special_tokens: bool
    multimodal: MultiModalInputs | None = None
    """The prompt's images; their tokens are placeholder ids in prompt_ids."""
    text_ids: list[int] | None = None
    """The prompt before its image tokens were expanded (what the vocabulary check reads)."""


class ChatService:
    def __init__(self, ctx: ServingContext) -> None:
        self.ctx = ctx

    async def create(self, req: ChatCompletionRequest, receive: Receive) -> Response:
        ctx = self.ctx.for_model(req.model)  # an adapter's name runs that adapter
        tokenizer = ctx.engine.tokenizer
        images = await load_message_images(req.messages, ctx.engine, ctx.media)
        # images: resized and patched on a worker thread
        chars = chat_chars(req.messages) + (OFF_LOOP_CHARS if images else 0)
        prep = await off_loop(chars, self.prepare, req, images)
        await compile_off_loop(ctx.engine, prep.spec)
        top_k = (req.top_logprobs or 0) if req.logprobs else None
        skip = False if prep.keep_special_tokens else None
        params = sampling_params(
            req, req.output_limit(), top_k, None, tokenizer.vocab_size, prep.spec, skip
        )
        ctx.admit(prep.text_ids or prep.prompt_ids, "messages")
        request_id = new_id("chatcmpl")
        head = ctx.header(request_id, "chat.completion", now())
        [stream] = ctx.start(request_id, [prep.prompt_ids], params, "messages", prep.multimodal)
        if req.stream:
            usage_flags = (req.include_usage(), req.continuous_usage())
            num_prompt = len(prep.prompt_ids)
            chunks = self._chunks(
                head, stream, params.n, top_k, usage_flags, num_prompt, prep.output
            )
            return SSEResponse(sse_frames(chunks, request_id))
        final = await until_disconnect(receive, collect([stream], ctx.metrics, "messages"))
        return JSONResponse(self._response(head, final[0], top_k, prep.output))

    def prepare(
        self, req: ChatCompletionRequest, images: list[LoadedImage] | None = None
    ) -> Prepared:
        """Tools, constraint and prompt (a worker thread runs this for long conversations or
        images); /v1/responses prepares its chat request here too."""
        ctx = self.ctx
        template = require_template(ctx)
        tools = plan_tools(req, template, ctx.tool_call_parser)
        spec = structured_outputs(req)
        if spec is not None and tools.spec is not None:
            raise errors.invalid(
                "response_format cannot be combined with tool_choice required or a named function.",
                "response_format",
            )
        spec = spec or tools.spec
        text = render_chat(
            ctx, req.messages, req.add_generation_prompt, tools, req.chat_template_kwargs
        )
        # A constrained output is the constraint's language from its first token: no thinking.
        reasoning = spec is None and wants_reasoning(ctx.reasoning_parser, template.source)
        output = OutputPlan(reasoning, text, tools.parser, req.parallel_tool_calls is False)
        processor = ctx.engine.image_processor
        prompt_text = processor.expand_prompt(text) if images and processor else text
        prompt_ids = ctx.engine.tokenizer.encode(prompt_text, add_special_tokens=False)
        prep = Prepared(prompt_ids, spec, output, tools.keep_special_tokens)
        if images:
            prep.text_ids = prompt_ids
            prep.prompt_ids, prep.multimodal = self._expand_images(req, prompt_ids, images)
        return prep

    def _expand_images(
        self, req: ChatCompletionRequest, prompt_ids: list[int], images: list[LoadedImage]
    ) -> tuple[list[int], MultiModalInputs]:
        """Each image preprocessed and its one template token expanded into the image's
        placeholder ids (core/multimodal/inputs.py)."""
        processor = self.ctx.engine.image_processor
        assert processor is not None, "load_message_images refuses images on text-only models"
        params = [f"messages[{i}].content[{j}].image_url"
                  for i, m in enumerate(req.messages) for j, _ in m.image_urls()]  # fmt: skip
        features = []
        for image, param in zip(images, params, strict=True):
            try:
                features.append(processor.preprocess(image.image, image.content_hash))
            except ValueError as exc:
                raise errors.invalid(f"The model cannot take this image: {exc}", param) from exc
        vocab_size = self.ctx.engine.tokenizer.vocab_size
        try:
            return expand_image_tokens(prompt_ids, features, processor.image_token_id, vocab_size)
        except ValueError as exc:
            raise errors.invalid(f"Chat template error: {exc}", param="messages") from exc

    def _response(
        self, head: dict[str, Any], out: RequestOutput, top_k: int | None, plan: OutputPlan
    ) -> dict[str, Any]:
        tokenizer = self.ctx.engine.tokenizer
        choices = []
        for o in out.outputs:
            logprobs = None
            if top_k is not None:
                logprobs = chat_logprobs(tokenizer, o.logprobs or [], top_k)
            parser = plan.new_choice()
            choices.append(
                {
                    "index": o.index,
                    "message": parser.message(o.text),
                    "logprobs": logprobs,
                    "finish_reason": parser.finish_reason(o.finish_reason),
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
        stream: RequestStream,
        n: int,
        top_k: int | None,
        usage_flags: tuple[bool, bool],
        num_prompt: int,
        plan: OutputPlan,
    ) -> AsyncIterator[dict[str, Any]]:
        """usage_flags: (usage chunk at the end, usage on every chunk)."""
        include_usage, continuous = usage_flags
        head = {**head, "object": "chat.completion.chunk"}
        if include_usage:
            head["usage"] = None
        tokenizer = self.ctx.engine.tokenizer
        for index in range(n):
            role = {"role": "assistant", "content": ""}
            yield {**head, "choices": [_choice(index, role, None, None)],
                   **running_usage(continuous, num_prompt, 0)}  # fmt: skip
        parsers = [plan.new_choice() for _ in range(n)]
        num_generated, cached = 0, 0
        with engine_errors("messages"):
            async for _, out in stream_outputs([stream], self.ctx.metrics):
                cached = out.metrics.num_cached_tokens if out.metrics else cached
                for o in out.outputs:
                    num_generated += len(o.token_ids)
                    if not (o.text or o.finish_reason or o.logprobs):
                        continue
                    logprobs = None
                    if top_k is not None:
                        logprobs = chat_logprobs(tokenizer, o.logprobs or [], top_k)
                    parser = parsers[o.index]
                    delta = parser.delta_of(o.text, final=o.finish_reason is not None)
                    reason = parser.finish_reason(o.finish_reason)
                    if delta or reason or logprobs:
                        choice = _choice(o.index, delta, logprobs, reason)
                        yield {**head, "choices": [choice],
                               **running_usage(continuous, num_prompt, num_generated)}  # fmt: skip
        if include_usage:
            yield {**head, "choices": [], "usage": usage(num_prompt, num_generated, cached)}


def _choice(
    index: int, delta: dict[str, Any], logprobs: dict[str, Any] | None, finish_reason: str | None
) -> dict[str, Any]:
    return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
