"""AsyncEngine: the engine loop on its own thread, one mailbox per request.

The event loop never runs model code. It hands commands (add, abort) to the engine thread
through a queue; the engine thread hands a step's outputs back in one `call_soon_threadsafe`,
into each request's mailbox. It does so when the next step's model starts (or at once when no
step follows): the model runs without the GIL, so the event loop's burst of work for those
outputs (one SSE frame per request) overlaps it instead of taking the GIL from the engine
thread's own Python between two steps. A mailbox never blocks its producer: when the consumer
lags, deltas merge. Every exit path of `generate()` (finished, error, client gone) aborts the
request in `finally`.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pagedserve.core.config import EngineConfig
from pagedserve.core.engine.in_flight import InFlight
from pagedserve.core.engine.llm_engine import LLMEngine
from pagedserve.core.engine.output_stream import Mailbox, OutputStream
from pagedserve.core.errors import EngineDeadError, QueueFullError
from pagedserve.core.lora_request import LoRARequest
from pagedserve.core.multimodal.inputs import MultiModalInputs
from pagedserve.core.outputs import CompletionOutput, EngineStats, RequestOutput
from pagedserve.core.pooling_params import PoolingParams
from pagedserve.core.sampling_params import SamplingParams, StructuredOutputs

logger = logging.getLogger(__name__)

MAX_CONSECUTIVE_FAILED_STEPS = 3


@dataclass
class _Add:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams | PoolingParams
    max_tokens: int | None = None  # resolved at admission (generation only)
    multimodal: MultiModalInputs | None = None
    lora_request: LoRARequest | None = None


@dataclass
class _Call:
    """fn() on the engine thread, between steps (what changes the model's weights: adapters);
    its result or exception settles `future` on the event loop."""

    fn: Callable[[], Any]
    future: asyncio.Future[Any]


@dataclass
class _Abort:
    request_id: str


class _Stop:
    pass


class AsyncEngine:
    def __init__(self, engine: LLMEngine, max_waiting: int) -> None:
        self.engine = engine
        self.max_waiting = max_waiting
        self.tokenizer = engine.tokenizer
        self.chat_template = engine.chat_template
        self.model_info = engine.model_info
        self.image_processor = engine.image_processor
        self._commands: queue.SimpleQueue[_Add | _Abort | _Stop | _Call] = queue.SimpleQueue()
        self._mailboxes: dict[str, Mailbox] = {}
        self._in_flight = InFlight()  # the event loop's: what running + waiting count
        self._errored: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop of the first generate()
        self._stats = engine.stats()
        self._held: list[RequestOutput] = []  # the engine thread's: outputs not yet handed over
        self._thread = threading.Thread(target=self._run, name="pagedserve-engine", daemon=True)
        self._thread.start()
        engine.on_fault(self._on_fault)

    @classmethod
    def from_config(cls, config: EngineConfig) -> AsyncEngine:
        return cls(LLMEngine.from_config(config), config.scheduler.max_waiting)

    @property
    def errored(self) -> bool:
        return self._errored is not None

    def stats(self) -> EngineStats:
        """The engine thread's last snapshot (never a live read), its running + waiting made
        the outputs in flight (`in_flight.py`): an output counts from its request's admission
        until its reader took its end or the request was aborted, at every instant."""
        return self._in_flight.split(self._stats)

    def _admit(self, num_prompt_tokens: int, params: SamplingParams) -> int:
        """The request's max_tokens, resolved against the context once, here; raises what
        the client must hear before anything is sent."""
        if self._errored is not None:
            raise EngineDeadError(self._errored)
        if not self.engine.can_generate:
            raise ValueError("this model has no LM head: it serves embeddings only")
        max_tokens = self.engine.resolve_max_tokens(num_prompt_tokens, params)
        self._check_queue()
        return max_tokens

    def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        multimodal: MultiModalInputs | None = None,
        lora_request: LoRARequest | None = None,
    ) -> OutputStream:
        """Admits the request now and returns the stream of its outputs (run with the adapter
        `lora_request`, one of list_loras(), or the base model).

        Admission is synchronous on purpose: ContextLengthError, QueueFullError and
        EngineDeadError reach the caller before it starts a response, and a burst of requests
        arriving together is counted one by one (no await between check and enqueue).
        """
        max_tokens = self._admit(len(prompt_token_ids), params)
        return self._submit(request_id, prompt_token_ids, params, max_tokens, multimodal,
                            lora_request)  # fmt: skip

    def list_loras(self) -> list[LoRARequest]:
        return self.engine.list_loras()

    async def load_lora(self, name: str, path: str) -> LoRARequest:
        """Load the LoRA adapter (PEFT folder or GGUF file) at `path` as `name`, between two steps; LoRAError naming
        what is wrong (the engine keeps serving)."""
        request: LoRARequest = await self._on_engine_thread(
            lambda: self.engine.add_lora(name, path)
        )
        return request

    async def unload_lora(self, name: str) -> None:
        """LoRANotFoundError when no adapter has that name."""
        await self._on_engine_thread(lambda: self.engine.remove_lora(name))

    async def _on_engine_thread(self, fn: Callable[[], Any]) -> Any:
        if self._errored is not None:
            raise EngineDeadError(self._errored)
        self._loop = self._loop or asyncio.get_running_loop()
        future: asyncio.Future[Any] = self._loop.create_future()
        self._commands.put(_Call(fn, future))
        return await future

    def embed(
        self, request_id: str, prompt_token_ids: list[int], params: PoolingParams
    ) -> OutputStream:
        """Admits an embedding request now (as generate does); its last output carries the
        vector."""
        if self._errored is not None:
            raise EngineDeadError(self._errored)
        self.engine.check_pooling(len(prompt_token_ids), params)
        self._check_queue()
        return self._submit(request_id, prompt_token_ids, params)

    def _check_queue(self) -> None:
        if self.stats().num_waiting >= self.max_waiting:
            raise QueueFullError(f"{self.max_waiting} requests are already waiting; retry later")

    def _submit(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams | PoolingParams,
        max_tokens: int | None = None,
        multimodal: MultiModalInputs | None = None,
        lora_request: LoRARequest | None = None,
    ) -> OutputStream:
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif self._loop is not loop:
            raise RuntimeError("an AsyncEngine serves one event loop")
        if request_id in self._mailboxes:
            raise ValueError(f"request id {request_id!r} is already in use")
        mailbox = Mailbox()
        self._mailboxes[request_id] = mailbox
        self._in_flight.add(request_id, params.n if isinstance(params, SamplingParams) else 1)
        add = _Add(request_id, list(prompt_token_ids), params, max_tokens, multimodal, lora_request)
        self._commands.put(add)
        return OutputStream(self, request_id, mailbox)

    def compile_grammar(self, spec: StructuredOutputs) -> None:
        """Compile spec's grammar into the engine's LRU (any thread; the server calls it on a
        worker thread before generate(), so the engine thread only finds it)."""
        self.engine.grammars.compile(spec)

    def took(self, request_id: str, output: RequestOutput) -> None:
        self._in_flight.took(request_id, output)

    def forget(self, request_id: str, abort: bool) -> None:
        self._mailboxes.pop(request_id, None)
        self._in_flight.forget(request_id)
        if abort:
            self._commands.put(_Abort(request_id))

    def abort(self, request_id: str) -> None:
        self._in_flight.forget(request_id)
        self._commands.put(_Abort(request_id))

    async def shutdown(self) -> None:
        self._commands.put(_Stop())
        await asyncio.to_thread(self._thread.join, 30)
        await asyncio.to_thread(self.engine.close)

    def _on_fault(self, reason: str) -> None:
        """A tensor-parallel worker died (watchdog thread): dead now (/health 503, admission
        refused), every stream ends with the error, and the engine thread stops when it next
        reads its commands (a step in flight fails on its own: its collective breaks)."""
        if self._errored is None:
            self._errored = reason
        self._commands.put(_Stop())
        self._post(self._fail_streams, reason)

    def _fail_streams(self, reason: str) -> None:
        for request_id in list(self._mailboxes):
            self._dispatch([_error_output(request_id, [], reason)])

    # ---- the engine thread ----------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._loop_forever()
        except EngineDeadError as exc:  # the tensor-parallel ranks are lost
            self._die(str(exc))
        except Exception as exc:  # a bug in scheduling/bookkeeping: fail loudly, never hang
            logger.exception("engine loop crashed")
            self._die(f"engine loop crashed: {exc}")

    def _loop_forever(self) -> None:
        failed_steps = 0
        while True:
            idle = not self.engine.has_unfinished()
            if idle:
                self._hand_over()  # no step follows to overlap with
            if not self._apply_commands(block=idle):
                return
            outputs = self.engine.step(before_execute=self._hand_over)
            self._hand_over()  # nothing ran (nothing was schedulable): do not wait for more
            self._stats = self.engine.stats()
            failed_steps = failed_steps + 1 if _any_error(outputs) else 0
            self._held = outputs
            if failed_steps >= MAX_CONSECUTIVE_FAILED_STEPS:
                self._die(f"engine failed {failed_steps} steps in a row; see the server log")
                return

    def _hand_over(self) -> None:
        """Give the held outputs of the last step to the event loop (see the module doc)."""
        held, self._held = self._held, []
        self._deliver(held)

    def _apply_commands(self, block: bool) -> bool:
        """Applies queued adds/aborts; waits for one when idle. False means stop."""
        while True:
            try:
                command = self._commands.get(block=block)
            except queue.Empty:
                return True
            block = False
            if isinstance(command, _Stop):
                self._die(self._errored or "the engine was shut down")
                return False
            if isinstance(command, _Abort):
                self.engine.abort(command.request_id)
                self._stats = self.engine.stats()
                continue
            if isinstance(command, _Call):
                self._call(command)
                continue
            self._add(command)

    def _add(self, command: _Add) -> None:
        try:
            self.engine.add_request(
                command.request_id, command.prompt_token_ids, command.params, command.max_tokens,
                multimodal=command.multimodal, lora_request=command.lora_request,
            )  # fmt: skip
            self._stats = self.engine.stats()
        except ValueError as exc:  # raced past admission; tell the client why
            self._deliver([_error_output(command.request_id, command.prompt_token_ids, str(exc))])

    def _call(self, command: _Call) -> None:
        try:
            result = command.fn()
        except Exception as exc:
            self._post(_settle, command.future, None, exc)
        else:
            self._post(_settle, command.future, result, None)

    def _die(self, reason: str) -> None:
        if self._errored is None:
            self._errored = reason
        self._hand_over()  # what finished before the failure arrives as it finished
        ids = self.engine.all_request_ids()
        outputs = self.engine.fail_requests(ids, reason)
        self._deliver(outputs)
        for request_id in list(self._mailboxes):
            if request_id not in ids:
                self._deliver([_error_output(request_id, [], reason)])

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        if outputs:
            self._post(self._dispatch, outputs)

    def _post(self, fn: Callable[..., None], *args: object) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(fn, *args)

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        for output in outputs:
            stream = self._mailboxes.get(output.request_id)
            if stream is not None:
                stream.put(output)


def _settle(future: asyncio.Future[Any], result: Any, exc: Exception | None) -> None:
    if future.done():  # the caller went away
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)


def _any_error(outputs: list[RequestOutput]) -> bool:
    return any(o.error is not None for o in outputs)


def _error_output(request_id: str, prompt: list[int], message: str) -> RequestOutput:
    return RequestOutput(
        request_id, prompt, [CompletionOutput(index=0, finish_reason="error")], True, error=message
    )
