"""POST /v1/completions: one engine request per prompt; choices are indexed prompt-major times n.

`echo` prepends the prompt (and, with `logprobs`, its logprobs, None for the first token) as
lm-eval's loglikelihood needs. `max_tokens: 0` with echo scores the prompt only: the engine
still samples one token (its minimum), which is dropped.

`suffix` on a model with fill-in-the-middle tokens makes each prompt the prefix of a FIM prompt
(fim.py) and the choices the middle; without FIM tokens a non-empty suffix is a 400 (an empty
one changes nothing there). With `echo` it is a 400: the FIM prompt is not the text in order.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from starlette.responses import Response
from starlette.types import Receive

from pagedserve.core.engine_client import RequestStream
from pagedserve.core.outputs import CompletionOutput, RequestOutput, TokenLogprob
from pagedserve.core.tokenizers.load import FimTokens
from pagedserve.openai_compat.common import errors
from pagedserve.openai_compat.common.http_responses import JSONResponse
from pagedserve.openai_compat.common.logprobs import CompletionLogprobs, merge_completion_logprobs
from pagedserve.openai_compat.common.protocol import CompletionRequest
from pagedserve.openai_compat.common.serving import (
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
from pagedserve.openai_compat.completions.fim import fim_params, fim_prompt, require_fim


@dataclass
class _Job:
    """What shaping the choices of one completions request needs."""

    prompts: list[list[int]]
    echo_texts: list[str]
    n: int
    echo: bool
    score_only: bool
    top_k: int | None
    continuous_usage: bool = False
    """Usage on every chunk (stream_options.continuous_usage_stats)."""
    prompt_logprobs: dict[int, list[TokenLogprob | None]] = field(default_factory=dict)
    builders: dict[int, CompletionLogprobs] = field(default_factory=dict)


class CompletionService:
    def __init__(self, ctx: ServingContext) -> None:
        self.ctx = ctx

    async def create(self, req: CompletionRequest, receive: Receive) -> Response:
        ctx = self.ctx.for_model(req.model)  # an adapter's name runs that adapter
        tokenizer = ctx.engine.tokenizer
        fim = self._fim(req)
        prompts, texts = await self._prompts(req.prompt, plain=fim is not None)
        if fim is not None:
            suffix_ids = await off_loop(len(req.suffix or ""), tokenizer.encode_plain, req.suffix)
            prompts = [fim_prompt(tokenizer, fim, p, suffix_ids) for p in prompts]
        score_only = req.max_tokens == 0
        top_k = req.logprobs
        prompt_k = top_k if req.echo and top_k is not None else None
        max_tokens = 1 if score_only else req.output_limit()
        spec = structured_outputs(req)
        await compile_off_loop(ctx.engine, spec)
        params = sampling_params(req, max_tokens, top_k, prompt_k, tokenizer.vocab_size, spec)
        params = params if fim is None else fim_params(params, fim)
        for prompt in prompts:
            ctx.admit(prompt, "prompt")
        job = _Job(prompts, texts, params.n, bool(req.echo), score_only, top_k)
        job.continuous_usage = req.continuous_usage()
        request_id = new_id("cmpl")
        head = ctx.header(request_id, "text_completion", now())
        streams = ctx.start(request_id, prompts, params, "prompt")
        if req.stream:
            chunks = self._chunks(head, job, streams, req.include_usage())
            return SSEResponse(sse_frames(chunks, request_id))
        finals = await until_disconnect(receive, collect(streams, ctx.metrics, "prompt"))
        return JSONResponse(self._response(head, job, finals))

    def _fim(self, req: CompletionRequest) -> FimTokens | None:
        """The FIM tokens when `suffix` asks for fill-in-the-middle, else None."""
        tokenizer = self.ctx.engine.tokenizer
        if req.suffix is None or (req.suffix == "" and tokenizer.fim is None):
            return None
        fim = require_fim(tokenizer, self.ctx.model_name, "suffix")
        if req.echo:
            raise errors.invalid("echo cannot be combined with suffix.", param="echo")
        return fim

    async def _prompts(
        self, prompt: str | list[str] | list[int] | list[list[int]], plain: bool = False
    ) -> tuple[list[list[int]], list[str]]:
        """Token ids and echo text of each prompt (plain: text without special tokens, as a
        FIM prefix is read)."""
        tokenizer = self.ctx.engine.tokenizer
        if isinstance(prompt, str):
            prompt = [prompt]
        if not prompt:
            raise errors.invalid("The prompt is empty.", param="prompt")
        if isinstance(prompt[0], int):
            prompt = [prompt]
        ids: list[list[int]] = []
        texts: list[str] = []
        for item in prompt:
            if isinstance(item, str) and plain:
                ids.append(await off_loop(len(item), tokenizer.encode_plain, item))
                texts.append(item)
            elif isinstance(item, str):
                ids.append(await off_loop(len(item), tokenizer.encode, item, True))
                texts.append(item)
            else:
                ids.append(list(item))
                texts.append("")  # decoded lazily: only echo needs it
        return ids, texts

    def _echo_text(self, job: _Job, p: int) -> str:
        if not job.echo_texts[p]:
            job.echo_texts[p] = self.ctx.engine.tokenizer.decode(job.prompts[p])
        return job.echo_texts[p]

    def _piece(self, job: _Job, p: int, o: CompletionOutput, first: bool) -> tuple[str, Any, int]:
        """(text, logprobs, num generated tokens) of one delta of choice (p, o.index)."""
        token_ids, lps = o.token_ids, o.logprobs or []
        text = o.text
        if job.score_only:
            token_ids, lps, text = [], [], ""
        logprobs: dict[str, Any] | None = None
        if job.top_k is not None:
            index = p * job.n + o.index
            builder = job.builders.setdefault(
                index, CompletionLogprobs(self.ctx.engine.tokenizer, job.top_k)
            )
            if first and job.echo:  # the prompt's part first: text offsets run on from it
                prompt_lps = job.prompt_logprobs.get(p) or [None] * len(job.prompts[p])
                logprobs = builder.build(job.prompts[p], prompt_lps)
            generated_lps = builder.build(token_ids, list(lps))
            logprobs = (
                merge_completion_logprobs(logprobs, generated_lps) if logprobs else generated_lps
            )
        if first and job.echo:
            text = self._echo_text(job, p) + text
        return text, logprobs, len(token_ids)

    def _response(
        self, head: dict[str, Any], job: _Job, finals: list[RequestOutput]
    ) -> dict[str, Any]:
        choices = []
        generated = 0
        for p, out in enumerate(finals):
            if out.prompt_logprobs is not None:
                job.prompt_logprobs[p] = out.prompt_logprobs
            for o in out.outputs:
                text, logprobs, num_tokens = self._piece(job, p, o, first=True)
                generated += num_tokens
                reason = _finish_reason(job, o)
                choices.append(_choice(p * job.n + o.index, text, logprobs, reason))
        num_prompt = sum(len(p) for p in job.prompts)
        cached = sum(f.metrics.num_cached_tokens for f in finals if f.metrics)
        return {**head, "choices": choices, "usage": usage(num_prompt, generated, cached)}

    async def _chunks(
        self,
        head: dict[str, Any],
        job: _Job,
        streams: list[RequestStream],
        include_usage: bool,
    ) -> AsyncIterator[dict[str, Any]]:
        if include_usage:
            head = {**head, "usage": None}
        started: set[int] = set()
        generated, cached = 0, 0
        num_prompt = sum(len(p) for p in job.prompts)
        with engine_errors("prompt"):
            async for p, out in stream_outputs(streams, self.ctx.metrics):
                if out.prompt_logprobs is not None:
                    job.prompt_logprobs[p] = out.prompt_logprobs
                if out.finished and out.metrics:
                    cached += out.metrics.num_cached_tokens
                for o in out.outputs:
                    index = p * job.n + o.index
                    first = index not in started
                    started.add(index)
                    text, logprobs, num_tokens = self._piece(job, p, o, first)
                    generated += num_tokens
                    reason = _finish_reason(job, o)
                    if text or reason or logprobs:
                        yield {**head, "choices": [_choice(index, text, logprobs, reason)],
                               **running_usage(job.continuous_usage, num_prompt, generated)}  # fmt: skip
        if include_usage:
            yield {**head, "choices": [], "usage": usage(num_prompt, generated, cached)}


def _choice(index: int, text: str, logprobs: Any, finish_reason: str | None) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}


def _finish_reason(job: _Job, o: CompletionOutput) -> str | None:
    # Scoring a prompt samples one token to be dropped; whatever ended it, the limit (0) did.
    return "length" if job.score_only and o.finish_reason else o.finish_reason
