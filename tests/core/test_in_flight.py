"""vllm:num_requests_running + vllm:num_requests_waiting (AsyncEngine.stats): every admitted
output that has not ended counts as running or waiting at every instant: right after
admission (before the engine thread saw it), once scheduled, preempted, while its last delta
is on its way, and until it is aborted; n > 1 siblings included."""

from __future__ import annotations

import asyncio
import collections

import pytest

from pagedserve.core.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from pagedserve.core.engine.async_engine import AsyncEngine
from pagedserve.core.engine.in_flight import InFlight
from pagedserve.core.engine.llm_engine import LLMEngine
from pagedserve.core.models.resolve import ResolvedModel
from pagedserve.core.outputs import CompletionOutput, EngineStats, RequestOutput
from pagedserve.core.sampling_params import SamplingParams

MAX_NUM_SEQS = 6


@pytest.fixture(scope="module")
def engine(default_model: ResolvedModel) -> LLMEngine:
    config = EngineConfig(
        model=ModelConfig(model=str(default_model.path), max_model_len=256),
        # 12 pages of 16 tokens for 6 running outputs of ~40-75 tokens: preemptions.
        cache=CacheConfig(num_pages=12),
        scheduler=SchedulerConfig(max_num_seqs=MAX_NUM_SEQS, max_num_batched_tokens=64),
    )
    return LLMEngine.from_config(config)


class Watch:
    """The test's own count of live outputs, checked against stats() at each moment."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.live: dict[str, int] = {}
        self.moments: collections.Counter[str] = collections.Counter()
        self.violations: list[tuple[str, int, int, int]] = []
        self.preemptions_seen = 0

    def check(self, moment: str) -> None:
        stats = self.engine.stats()
        want = sum(self.live.values())
        running, waiting = stats.num_running, stats.num_waiting
        if running + waiting != want or running > MAX_NUM_SEQS or min(running, waiting) < 0:
            self.violations.append((moment, running, waiting, want))
        self.moments[moment] += 1

    async def poll(self, done: asyncio.Event) -> None:
        """Every turn of the event loop, whatever the engine thread is doing."""
        start = self.engine.stats().num_preemptions
        while not done.is_set():
            self.check("any turn")
            self.preemptions_seen = self.engine.stats().num_preemptions - start
            await asyncio.sleep(0)


async def _one(watch: Watch, i: int, prompt: list[int]) -> None:
    n = 2 if i % 4 == 0 else 1
    params = SamplingParams(n=n, temperature=0.8, seed=i, max_tokens=30 + 8 * (i % 5),
                            ignore_eos=True)  # fmt: skip
    request_id = f"in-flight-{i}"
    stream = watch.engine.generate(request_id, prompt, params)
    watch.live[request_id] = n
    watch.check("admitted")
    num_outputs = 0
    async for out in stream:
        watch.live[request_id] -= sum(1 for c in out.outputs if c.finish_reason is not None)
        num_outputs += 1
        watch.check("first output" if num_outputs == 1 else "output")
        if i % 5 == 3 and num_outputs == 3:  # the client leaves mid-stream
            await stream.aclose()
            watch.live.pop(request_id)
            watch.check("aborted")
            return
    watch.live.pop(request_id)
    watch.check("finished")


def test_every_admitted_output_counts_at_every_instant(engine: LLMEngine) -> None:
    async def scenario() -> Watch:
        async_engine = AsyncEngine(engine, max_waiting=64)
        watch = Watch(async_engine)
        done = asyncio.Event()
        poller = asyncio.ensure_future(watch.poll(done))
        prompt = engine.tokenizer.encode("Tell me a long story about a lighthouse keeper.")
        try:
            await asyncio.gather(*(_one(watch, i, prompt) for i in range(8)))
            watch.check("all ended")
        finally:
            done.set()
            await poller
            await async_engine.shutdown()
        return watch

    watch = asyncio.run(scenario())
    assert watch.violations == []
    assert watch.preemptions_seen > 0  # the storm preempted while the poller watched
    assert {"admitted", "first output", "aborted", "finished"} <= set(watch.moments)
    assert watch.moments["any turn"] > 100


def _stats(running: int, waiting: int) -> EngineStats:
    return EngineStats(running, waiting, 8, 16, 8, 0, 0, 0, 0, 0)


def test_the_split_never_hides_an_output() -> None:
    in_flight = InFlight()
    # Admitted, the engine thread's snapshot not yet taken: waiting.
    in_flight.add("a", 2)
    split = in_flight.split(_stats(0, 0))
    assert (split.num_running, split.num_waiting) == (0, 2)
    # The snapshot ran one sibling (the other is queued in the output processor): 1 + 1.
    split = in_flight.split(_stats(1, 0))
    assert (split.num_running, split.num_waiting) == (1, 1)
    # One sibling's end taken by the reader, while a stale snapshot still runs both.
    done = CompletionOutput(0, "x", [1], finish_reason="length")
    in_flight.took("a", RequestOutput("a", [1], [done, CompletionOutput(1, "y", [2])]))
    split = in_flight.split(_stats(2, 0))
    assert (split.num_running, split.num_waiting) == (1, 0)
    # Aborted: nothing left, whatever the snapshot says.
    in_flight.forget("a")
    split = in_flight.split(_stats(2, 3))
    assert (split.num_running, split.num_waiting) == (0, 0)
    in_flight.forget("a")  # a second close is harmless
    assert in_flight.total == 0
