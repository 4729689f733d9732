"""What chat and completions share: model check, SamplingParams, engine errors, usage, merging."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pagedserve import __version__
from pagedserve.core.engine_client import EngineClient, RequestStream
from pagedserve.core.errors import ContextLengthError, EngineDeadError, QueueFullError
from pagedserve.core.lora_request import LoRARequest
from pagedserve.core.multimodal.inputs import MultiModalInputs
from pagedserve.core.outputs import RequestOutput
from pagedserve.core.sampling_params import (
    SamplingParams,
    SamplingParamsError,
    StructuredOutputs,
)
from pagedserve.openai_compat.common import errors
from pagedserve.openai_compat.common.media import MediaConfig
from pagedserve.openai_compat.common.metrics import ServerMetrics
from pagedserve.openai_compat.common.protocol import ChatCompletionRequest, CompletionRequest

logger = logging.getLogger("pagedserve.server")
T = TypeVar("T")

SYSTEM_FINGERPRINT = f"fp_pagedserve_{__version__}"
OFF_LOOP_CHARS = 16_384
"""Texts this long are rendered and tokenized on a worker thread: megabytes take seconds, and the
event loop must keep serving every other stream meanwhile."""


async def off_loop(chars: int, fn: Callable[..., T], *args: Any) -> T:
    """fn(*args) inline for short inputs (a thread hop costs more than they do), else on a
    worker thread."""
    if chars < OFF_LOOP_CHARS:
        return fn(*args)
    return await asyncio.to_thread(fn, *args)


@dataclass
class ServingContext:
    """The loaded engine plus what every response needs."""

    engine: EngineClient
    model_name: str
    metrics: ServerMetrics
    tool_call_parser: str = "auto"
    """ServerConfig.tool_call_parser."""
    reasoning_parser: str = "auto"
    """ServerConfig.reasoning_parser."""
    lora_request: LoRARequest | None = None
    """The LoRA adapter this context's requests run with (for_model; None: the base model)."""
    media: MediaConfig = field(default_factory=MediaConfig)
    """Where images may come from and how many (ServerConfig's media fields)."""
    aliases: tuple[str, ...] = ()
    """Other names the model answers to (--served-model-name's after the first); responses
    still carry model_name."""

    def check_model(self, model: str | None) -> None:
        self.for_model(model)

    def for_model(self, model: str | None) -> ServingContext:
        """This context for a request naming `model`: itself for the model's own names (or
        none), a copy that runs the adapter and answers with its name for a loaded LoRA
        adapter's; else 404 model_not_found."""
        if not model or model == self.model_name or model in self.aliases:
            return self
        for lora in self.engine.list_loras():
            if lora.lora_name == model:
                return dataclasses.replace(self, model_name=model, lora_request=lora)
        raise errors.model_not_found(model)

    def header(self, request_id: str, obj: str, created: int) -> dict[str, Any]:
        return {
            "id": request_id,
            "object": obj,
            "created": created,
            "model": self.model_name,
            "system_fingerprint": SYSTEM_FINGERPRINT,
        }

    def admit(self, prompt_token_ids: list[int], param: str) -> None:
        """Raise the client's error about the prompt itself now, before any header is sent
        (the engine's own refusals, length and queue, come from `start`, also before)."""
        vocab_size = self.engine.tokenizer.vocab_size
        if not prompt_token_ids:
            raise errors.invalid("The prompt is empty.", param=param)
        require_in_vocabulary(prompt_token_ids, vocab_size, param)

    def start(
        self,
        request_id: str,
        prompts: list[list[int]],
        params: SamplingParams,
        param: str,
        multimodal: MultiModalInputs | None = None,
    ) -> list[RequestStream]:
        """Hand every prompt to the engine now, before any header is sent: the engine admits
        synchronously, so a full queue is this request's 429, never a 200 then an error frame.
        All or nothing: a refusal closes the streams already started (which aborts them)."""
        streams: list[RequestStream] = []
        try:
            with engine_errors(param):
                for i, prompt in enumerate(prompts):
                    sub_id = request_id if len(prompts) == 1 else f"{request_id}-{i}"
                    if multimodal is None and self.lora_request is None:
                        streams.append(self.engine.generate(sub_id, prompt, params))
                    else:
                        lora = self.lora_request
                        streams.append(self.engine.generate(sub_id, prompt, params, multimodal,
                                                            lora_request=lora))  # fmt: skip
        except BaseException:
            for stream in streams:
                stream.close()
            raise
        return streams


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


def now() -> int:
    return int(time.time())


class engine_errors:
    """Context manager turning the engine's boundary errors into API errors."""

    def __init__(self, param: str) -> None:
        self.param = param

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type | None, exc: BaseException | None, tb: object) -> None:
        if isinstance(exc, SamplingParamsError):
            raise errors.from_sampling_error(exc) from exc
        if isinstance(exc, ContextLengthError):
            raise errors.invalid(str(exc), self.param, "context_length_exceeded") from exc
        if isinstance(exc, QueueFullError):
            raise errors.queue_full() from exc
        if isinstance(exc, EngineDeadError):
            raise errors.unavailable(str(exc)) from exc


def sampling_params(
    req: ChatCompletionRequest | CompletionRequest,
    max_tokens: int | None,
    logprobs: int | None,
    prompt_logprobs: int | None,
    vocab_size: int,
    structured: StructuredOutputs | None = None,
    skip_special_tokens: bool | None = None,
) -> SamplingParams:
    """OpenAI's fields (None means OpenAI's default) as SamplingParams."""
    with engine_errors("messages"):
        return SamplingParams(
            n=req.n or 1,
            max_tokens=max_tokens,
            min_tokens=req.min_tokens,
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            top_k=req.top_k or 0,
            min_p=req.min_p or 0.0,
            presence_penalty=req.presence_penalty or 0.0,
            frequency_penalty=req.frequency_penalty or 0.0,
            repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
            logit_bias=_logit_bias(req.logit_bias, vocab_size),
            seed=req.seed,
            stop=req.stop_list(),
            stop_token_ids=_stop_token_ids(req.stop_token_ids, vocab_size),
            ignore_eos=req.ignore_eos,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            include_stop_str_in_output=req.include_stop_str_in_output,
            skip_special_tokens=(
                req.skip_special_tokens if skip_special_tokens is None else skip_special_tokens
            ),
            structured=structured,
        )
    raise AssertionError("unreachable")  # engine_errors re-raises every exception


def require_in_vocabulary(token_ids: list[int], vocab_size: int, param: str) -> None:
    bad = next((t for t in token_ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise errors.invalid(f"Token ids must be in [0, {vocab_size}), got {bad}.", param=param)


def _stop_token_ids(ids: list[int] | None, vocab_size: int) -> tuple[int, ...]:
    # An id outside the vocabulary can never be sampled: the stop would silently never fire.
    require_in_vocabulary(ids or [], vocab_size, "stop_token_ids")
    return tuple(ids or ())


def _logit_bias(bias: dict[str, float] | None, vocab_size: int) -> dict[int, float]:
    out: dict[int, float] = {}
    for key, value in (bias or {}).items():
        try:
            token_id = int(key)
        except ValueError:
            raise errors.invalid(
                f"logit_bias key {key!r} is not a token id.", "logit_bias"
            ) from None
        if not 0 <= token_id < vocab_size:
            raise errors.invalid(
                f"logit_bias token {token_id} is out of the vocabulary.", "logit_bias"
            )
        out[token_id] = value
    return out


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def running_usage(continuous: bool, num_prompt: int, num_generated: int) -> dict[str, Any]:
    """`{"usage": ...}` so far, to merge into a chunk, when `stream_options.
    continuous_usage_stats` asked for usage on every chunk (as vLLM gives it); else nothing."""
    return {"usage": usage(num_prompt, num_generated)} if continuous else {}


def check_output(output: RequestOutput, metrics: ServerMetrics) -> None:
    """Record a finished request; raise a 500 when the engine failed it."""
    if output.error is not None:
        logger.error("request %s failed in the engine: %s", output.request_id, output.error)
        raise errors.internal(output.request_id)
    if output.finished:
        metrics.record(output.metrics)


async def merge_streams(
    streams: Sequence[RequestStream],
) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Interleave several engine streams as (stream index, output); closing this closes all.
    One stream (one prompt: the common case, run once per streamed token) is read directly,
    without the pump tasks and queue."""
    if len(streams) == 1:
        stream, finished = streams[0], False
        try:
            async for output in stream:
                finished = output.finished
                yield 0, output
        finally:
            if not finished:
                stream.close()  # aborts the request and frees its pages
        return
    queue: asyncio.Queue[tuple[int, RequestOutput | BaseException | None]] = asyncio.Queue()

    async def pump(index: int, stream: AsyncIterator[RequestOutput]) -> None:
        try:
            async for output in stream:
                queue.put_nowait((index, output))
        except Exception as exc:  # handed to the consumer, which raises it
            queue.put_nowait((index, exc))
        finally:
            queue.put_nowait((index, None))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            index, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()  # cancelling a pump closes its engine stream, which aborts it
        await asyncio.gather(*tasks, return_exceptions=True)


async def stream_outputs(
    streams: Sequence[RequestStream], metrics: ServerMetrics
) -> AsyncIterator[tuple[int, RequestOutput]]:
    """merge_streams, failing on engine errors and recording each finished request. Closing
    this early closes the streams (aborting them)."""
    merged = merge_streams(streams)
    try:
        async for index, output in merged:
            check_output(output, metrics)
            yield index, output
    finally:
        await merged.aclose()  # type: ignore[attr-defined]


async def collect(
    streams: Sequence[RequestStream], metrics: ServerMetrics, param: str
) -> list[RequestOutput]:
    """Each stream's outputs merged into one whole RequestOutput, in stream order."""
    finals: list[RequestOutput | None] = [None] * len(streams)
    with engine_errors(param):
        async for index, output in stream_outputs(streams, metrics):
            held = finals[index]
            if held is None:
                finals[index] = output
            else:
                held.merge(output)
    if any(f is None for f in finals):
        raise RuntimeError("an engine stream ended without output")
    return [f for f in finals if f is not None]
