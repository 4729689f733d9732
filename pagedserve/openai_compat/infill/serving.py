"""POST /infill: llama.cpp's code infill on the completions machinery, answered in llama.cpp's
/completion shape: `content`, `stop`, `stop_type` (eos, limit, word), `stopping_word`,
`tokens_predicted`, `tokens_evaluated`, `tokens_cached`, `truncated` (here: the input was cut
to fit the context), `timings`. Streamed as `data: {...}` lines, one per delta with `stop:
false`, then a last one with `stop: true` and the totals; no `[DONE]` (llama.cpp sends none).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from starlette.responses import Response
from starlette.types import Receive

from pagedserve.core.engine_client import RequestStream
from pagedserve.core.outputs import CompletionOutput, RequestMetrics
from pagedserve.core.sampling_params import SamplingParams
from pagedserve.openai_compat.common.http_responses import JSONResponse
from pagedserve.openai_compat.common.serving import (
    ServingContext,
    collect,
    engine_errors,
    new_id,
    off_loop,
    stream_outputs,
)
from pagedserve.openai_compat.common.streaming import SSEResponse, sse_frames, until_disconnect
from pagedserve.openai_compat.completions.fim import fim_params, require_fim
from pagedserve.openai_compat.infill.prompt import infill_prompt
from pagedserve.openai_compat.infill.protocol import InfillRequest

PARAM = "input_prefix"
"""The field a refused prompt is charged to (too long for the context)."""


@dataclass(frozen=True)
class _Job:
    num_prompt: int
    truncated: bool
    score_only: bool
    """n_predict 0: the engine samples one token (its minimum), which is dropped."""


class InfillService:
    def __init__(self, ctx: ServingContext) -> None:
        self.ctx = ctx

    async def create(self, req: InfillRequest, receive: Receive) -> Response:
        ctx = self.ctx.for_model(req.model)  # an adapter's name runs that adapter
        tokenizer = ctx.engine.tokenizer
        fim = require_fim(tokenizer, ctx.model_name, None)
        params = fim_params(self._params(req), fim)
        budget = ctx.engine.model_info.max_model_len - (params.max_tokens or 1)
        prompt = await off_loop(req.input_chars(), infill_prompt, tokenizer, fim, req, budget)
        ctx.admit(prompt.token_ids, PARAM)
        job = _Job(len(prompt.token_ids), prompt.truncated, req.n_predict == 0)
        request_id = new_id("infill")
        streams = ctx.start(request_id, [prompt.token_ids], params, PARAM)
        if req.stream:
            return SSEResponse(sse_frames(self._chunks(job, streams), request_id, done=False))
        [final] = await until_disconnect(receive, collect(streams, ctx.metrics, PARAM))
        [output] = final.outputs
        if job.score_only:
            output.text, output.token_ids = "", []
        body = self._last(job, output, final.metrics, len(output.token_ids))
        return JSONResponse({**body, "content": output.text, "tokens": output.token_ids})

    def _params(self, req: InfillRequest) -> SamplingParams:
        with engine_errors(PARAM):
            return SamplingParams(
                max_tokens=None if req.n_predict < 0 else max(req.n_predict, 1),
                temperature=1.0 if req.temperature is None else req.temperature,
                top_p=1.0 if req.top_p is None else req.top_p,
                top_k=req.top_k or 0,
                min_p=req.min_p or 0.0,
                presence_penalty=req.presence_penalty or 0.0,
                frequency_penalty=req.frequency_penalty or 0.0,
                repetition_penalty=1.0 if req.repeat_penalty is None else req.repeat_penalty,
                seed=None if req.seed in (None, -1) else req.seed,
                stop=tuple(req.stop or ()),
                ignore_eos=req.ignore_eos,
            )
        raise AssertionError("unreachable")  # engine_errors re-raises every exception

    async def _chunks(
        self, job: _Job, streams: list[RequestStream]
    ) -> AsyncIterator[dict[str, Any]]:
        generated = 0
        with engine_errors(PARAM):
            async for _, out in stream_outputs(streams, self.ctx.metrics):
                [delta] = out.outputs or [CompletionOutput(0)]
                if job.score_only:
                    delta.text, delta.token_ids = "", []
                generated += len(delta.token_ids)
                if delta.text or delta.token_ids:
                    yield {"index": 0, "content": delta.text, "tokens": delta.token_ids,
                           "stop": False, "tokens_predicted": generated,
                           "tokens_evaluated": job.num_prompt}  # fmt: skip
                if out.finished:
                    yield self._last(job, delta, out.metrics, generated)

    def _last(
        self, job: _Job, output: CompletionOutput, metrics: RequestMetrics | None, predicted: int
    ) -> dict[str, Any]:
        """A stream's last line (the response adds the whole text and its tokens)."""
        stop_type, word = _stop_type(output, job.score_only)
        cached = metrics.num_cached_tokens if metrics else 0
        return {
            "index": 0,
            "content": "",
            "tokens": [],
            "stop": True,
            "model": self.ctx.model_name,
            "tokens_predicted": predicted,
            "tokens_evaluated": job.num_prompt,
            "tokens_cached": cached,
            "stop_type": stop_type,
            "stopping_word": word,
            "truncated": job.truncated,
            "timings": _timings(metrics, job.num_prompt - cached, predicted),
        }


def _stop_type(output: CompletionOutput, score_only: bool) -> tuple[str, str]:
    """llama.cpp's (stop_type, stopping_word): eos, limit (n_predict or the context) or word."""
    if score_only or output.finish_reason == "length":
        return "limit", ""
    if isinstance(output.stop_reason, str):
        return "word", output.stop_reason
    return "eos", ""


def _timings(metrics: RequestMetrics | None, prompt_n: int, predicted_n: int) -> dict[str, Any]:
    """llama.cpp's timings from the engine's clock (ms; per second where a span was timed)."""
    m = metrics or RequestMetrics(0.0)
    prompt_ms = _ms(m.first_scheduled_time, m.first_token_time)
    predicted_ms = _ms(m.first_token_time, m.last_token_time)
    return {
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_second": prompt_n * 1000 / prompt_ms if prompt_ms else None,
        "predicted_n": predicted_n,
        "predicted_ms": predicted_ms,
        "predicted_per_second": (predicted_n - 1) * 1000 / predicted_ms if predicted_ms else None,
    }


def _ms(start: float | None, end: float | None) -> float:
    return (end - start) * 1000 if start is not None and end is not None else 0.0
