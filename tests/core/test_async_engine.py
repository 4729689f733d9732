"""AsyncEngine: mailboxes, streaming deltas, aborts that free pages, overload and faults."""

from __future__ import annotations

import asyncio

import pytest

from pagedserve.core.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from pagedserve.core.engine.async_engine import AsyncEngine
from pagedserve.core.engine.llm_engine import LLMEngine
from pagedserve.core.engine.output_stream import Mailbox
from pagedserve.core.errors import ContextLengthError, EngineDeadError, QueueFullError
from pagedserve.core.models.resolve import ResolvedModel
from pagedserve.core.outputs import CompletionOutput, RequestOutput
from pagedserve.core.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def engine(default_model: ResolvedModel) -> LLMEngine:
    config = EngineConfig(
        model=ModelConfig(model=str(default_model.path), max_model_len=512),
        cache=CacheConfig(num_pages=256),
        scheduler=SchedulerConfig(max_waiting=4),
    )
    return LLMEngine.from_config(config)


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


async def collect(engine: AsyncEngine, request_id: str, params: SamplingParams) -> list:
    prompt = engine.tokenizer.encode("Write a haiku about the sea.")
    return [out async for out in engine.generate(request_id, prompt, params)]


def test_mailbox_merges_deltas_when_the_consumer_lags() -> None:
    async def scenario() -> RequestOutput:
        stream = Mailbox()
        stream.put(RequestOutput("r", [1], [CompletionOutput(0, "a", [5])]))
        stream.put(
            RequestOutput("r", [1], [CompletionOutput(0, "b", [6], finish_reason="stop")], True)
        )
        return await stream.get()

    merged = run(scenario())
    assert merged.outputs[0].text == "ab" and merged.outputs[0].token_ids == [5, 6]
    assert merged.finished and merged.outputs[0].finish_reason == "stop"


def test_mailbox_wakes_its_reader_and_survives_a_cancelled_read() -> None:
    async def scenario() -> list[str]:
        box = Mailbox()
        reader = asyncio.ensure_future(box.get())
        await asyncio.sleep(0)  # the reader waits
        box.put(RequestOutput("r", [1], [CompletionOutput(0, "a", [5])]))
        first = await reader
        cancelled = asyncio.ensure_future(box.get())
        await asyncio.sleep(0)
        cancelled.cancel()  # a client that went away mid-wait
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        box.put(RequestOutput("r", [1], [CompletionOutput(0, "b", [6])]))
        second = await box.get()  # ready at once: no wait, nothing lost
        return [first.outputs[0].text, second.outputs[0].text]

    assert run(scenario()) == ["a", "b"]


def test_generate_streams_deltas_then_finishes(engine: LLMEngine) -> None:
    async def scenario() -> list:
        async_engine = AsyncEngine(engine, max_waiting=4)
        try:
            return await collect(async_engine, "a", SamplingParams(temperature=0, max_tokens=12))
        finally:
            await async_engine.shutdown()

    outputs = run(scenario())
    assert outputs[-1].finished and not any(o.finished for o in outputs[:-1])
    tokens = [t for o in outputs for c in o.outputs for t in c.token_ids]
    text = "".join(c.text for o in outputs for c in o.outputs)
    assert len(tokens) <= 12 and text == engine.tokenizer.decode(tokens)
    assert outputs[-1].metrics is not None and outputs[-1].metrics.time_to_first_token > 0


def test_closing_the_generator_aborts_and_frees_pages(engine: LLMEngine) -> None:
    async def scenario() -> int:
        async_engine = AsyncEngine(engine, max_waiting=4)
        prompt = engine.tokenizer.encode("Count from one to a thousand: one, two,")
        params = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)
        gen = async_engine.generate("b", prompt, params)
        await gen.__anext__()  # running, holding pages
        assert async_engine.engine.scheduler.stats().num_used_pages > 0
        await gen.aclose()  # the client went away
        for _ in range(200):
            await asyncio.sleep(0.02)
            if async_engine.stats().num_used_pages == 0 and async_engine.stats().num_running == 0:
                break
        await async_engine.shutdown()
        return async_engine.stats().num_used_pages

    assert run(scenario()) == 0
    assert not engine.has_unfinished()


def test_admission_errors_come_before_the_first_output(engine: LLMEngine) -> None:
    async def scenario() -> None:
        async_engine = AsyncEngine(engine, max_waiting=4)
        try:
            with pytest.raises(ContextLengthError):
                await collect(async_engine, "c", SamplingParams(max_tokens=10_000))
            for i in range(4):  # as if four admitted requests were waiting
                async_engine._in_flight.add(f"queued-{i}", 1)
            with pytest.raises(QueueFullError):
                await collect(async_engine, "d", SamplingParams(max_tokens=4))
            for i in range(4):
                async_engine._in_flight.forget(f"queued-{i}")
        finally:
            await async_engine.shutdown()

    run(scenario())


def test_a_burst_is_admitted_one_by_one(engine: LLMEngine) -> None:
    """No await between the queue check and the enqueue: of a burst larger than the waiting
    limit, the excess is refused at once, before anything is streamed."""

    async def scenario() -> tuple[int, int]:
        async_engine = AsyncEngine(engine, max_waiting=4)
        prompt = engine.tokenizer.encode("Hello")
        params = SamplingParams(max_tokens=2)
        streams, refused = [], 0
        for i in range(10):
            try:
                streams.append(async_engine.generate(f"burst-{i}", prompt, params))
            except QueueFullError:
                refused += 1
        for stream in streams:
            [o async for o in stream]
        await async_engine.shutdown()
        return len(streams), refused

    assert run(scenario()) == (4, 6)


def test_a_stream_dropped_unread_is_aborted(engine: LLMEngine) -> None:
    async def scenario() -> tuple[bool, int]:
        async_engine = AsyncEngine(engine, max_waiting=4)
        prompt = engine.tokenizer.encode("Count from one to a thousand:")
        params = SamplingParams(max_tokens=400, ignore_eos=True)
        stream = async_engine.generate("dropped", prompt, params)
        del stream  # never read: the request must not run on to 400 tokens
        for _ in range(100):
            await asyncio.sleep(0.02)
            if async_engine._commands.empty() and not engine.has_unfinished():  # add, abort seen
                break
        running = engine.has_unfinished()  # before shutdown, which would fail it anyway
        pages = engine.scheduler.stats().num_used_pages
        await async_engine.shutdown()
        return running, pages

    assert run(scenario()) == (False, 0)


def test_a_dead_engine_fails_requests_and_refuses_new_ones(engine: LLMEngine, monkeypatch) -> None:
    def broken(*args: object) -> None:
        raise RuntimeError("scheduler bug")

    async def scenario() -> list:
        async_engine = AsyncEngine(engine, max_waiting=4)
        monkeypatch.setattr(engine.scheduler, "schedule", broken)
        outputs = await collect(async_engine, "e", SamplingParams(max_tokens=4))
        assert async_engine.errored
        with pytest.raises(EngineDeadError):
            await collect(async_engine, "f", SamplingParams(max_tokens=4))
        await async_engine.shutdown()
        return outputs

    outputs = run(scenario())
    assert outputs[-1].finished and "scheduler bug" in (outputs[-1].error or "")


def test_step_calls_before_execute_once_just_before_the_model(
    engine: LLMEngine, monkeypatch
) -> None:
    """The hook AsyncEngine hands the previous step's outputs over in: once per step that runs
    the model, before it; never for a step with nothing to run."""
    events: list[str] = []
    execute = engine.model_runner.execute

    def recorded(*args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        events.append("model")
        return execute(*args, **kwargs)

    monkeypatch.setattr(engine.model_runner, "execute", recorded)
    assert engine.step(before_execute=lambda: events.append("hook")) == [] and events == []
    prompt = engine.tokenizer.encode("Hello")
    engine.add_request("hook", prompt, SamplingParams(temperature=0, max_tokens=3))
    while engine.has_unfinished():
        engine.step(before_execute=lambda: events.append("hook"))
    assert events and events == ["hook", "model"] * (len(events) // 2)
