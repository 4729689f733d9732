"""The model pool (openai_compat/model_pool.py) over fake engines: loading on demand, LRU
eviction of idle models only (a stream in flight holds its model), the memory budget, idle
unloading, a failed load; and the app's /v1/models, /health and errors over a pool."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
from starlette.testclient import TestClient

from pagedserve.core.engine_client import EngineClient
from pagedserve.core.sampling_params import SamplingParams
from pagedserve.openai_compat.app import create_app
from pagedserve.openai_compat.common import errors
from pagedserve.openai_compat.model_pool import ModelPool, ModelSpec, PoolLimits
from pagedserve.openai_compat.server_config import ServerConfig
from tests.openai_compat.fake_engine import FakeEngine


class Loads:
    """Fake engines by model name, counting loads and shutdowns."""

    def __init__(self, token_delay: float = 0.0) -> None:
        self.token_delay = token_delay
        self.engines: dict[str, list[FakeEngine]] = {}
        self.stopped: list[str] = []

    def spec(self, name: str, memory_bytes: int = 0, fail: bool = False) -> ModelSpec:
        return ModelSpec(name, lambda: self._load(name, fail), f"/models/{name}", memory_bytes)

    def _load(self, name: str, fail: bool) -> FakeEngine:
        if fail:
            raise ValueError(f"{name}.gguf is not a GGUF file")
        engine = FakeEngine(token_delay=self.token_delay)
        stopped = self.stopped

        async def shutdown() -> None:
            stopped.append(name)

        engine.shutdown = shutdown  # type: ignore[method-assign]
        self.engines.setdefault(name, []).append(engine)
        return engine


def _pool(specs: list[ModelSpec], limits: PoolLimits) -> ModelPool[EngineClient]:
    def build(name: str, engine: EngineClient) -> EngineClient:
        return engine

    return ModelPool(specs, limits, True, build, lambda n, e: None, lambda e, m: False)


def _status(pool: ModelPool[Any]) -> dict[str, str]:
    return {m.name: m.status for m in pool.states()}


async def _generate(engine: EngineClient, max_tokens: int = 4) -> str:
    stream = engine.generate("r", [1, 2], SamplingParams(max_tokens=max_tokens))
    return "".join([o.outputs[0].text async for o in stream])


def _run(test: Callable[[], Any]) -> None:
    asyncio.run(asyncio.wait_for(test(), 30))


def test_loads_on_demand_and_evicts_the_least_recently_used_idle_model() -> None:
    loads = Loads()

    async def test() -> None:
        pool = _pool([loads.spec("a"), loads.spec("b"), loads.spec("c")], PoolLimits(max_loaded=2))
        pool.start()
        assert _status(pool) == {"a": "unloaded", "b": "unloaded", "c": "unloaded"}
        for name in ("a", "b", "a"):
            async with pool.use(name) as engine:
                assert await _generate(engine) == "abcd"
        assert _status(pool) == {"a": "loaded", "b": "loaded", "c": "unloaded"}
        async with pool.use("c"):
            pass
        assert _status(pool) == {"a": "loaded", "b": "unloaded", "c": "loaded"}  # b: the LRU
        assert loads.stopped == ["b"] and len(loads.engines["a"]) == 1
        with pytest.raises(errors.APIError) as info:
            async with pool.use("nope"):
                pass
        assert info.value.status == 404 and info.value.code == "model_not_found"
        await pool.close()
        assert sorted(loads.stopped) == ["a", "b", "c"]

    _run(test)


def test_a_stream_in_flight_holds_its_model_until_it_ends() -> None:
    """max_loaded 1: a request for b waits while a's stream runs, then a is evicted; a's
    stream is never cut."""
    loads = Loads(token_delay=0.02)

    async def test() -> None:
        pool = _pool([loads.spec("a"), loads.spec("b")], PoolLimits(max_loaded=1))
        async with pool.use("a") as engine:
            stream = engine.generate("r", [1], SamplingParams(max_tokens=20))
        # the lease is gone, the stream still holds a
        first = await stream.__anext__()

        async def use_b() -> str:
            async with pool.use("b") as b:
                return await _generate(b)

        b_task = asyncio.ensure_future(use_b())
        await asyncio.sleep(0.1)
        assert not b_task.done() and _status(pool)["a"] == "loaded"
        rest = [o async for o in stream]
        assert len(first.outputs[0].text + "".join(o.outputs[0].text for o in rest)) == 20
        assert rest[-1].outputs[0].finish_reason == "length"
        assert await b_task == "abcd"
        assert _status(pool) == {"a": "unloaded", "b": "loaded"} and loads.stopped == ["a"]
        assert loads.engines["a"][0].aborted == []
        await pool.close()

    _run(test)


def test_a_closed_stream_releases_its_model() -> None:
    loads = Loads(token_delay=0.02)

    async def test() -> None:
        pool = _pool([loads.spec("a"), loads.spec("b")], PoolLimits(max_loaded=1))
        async with pool.use("a") as engine:
            stream = engine.generate("r", [1], SamplingParams(max_tokens=50))
        await stream.__anext__()
        stream.close()  # the client left: aborted, and a is idle again
        async with pool.use("b"):
            pass
        assert _status(pool) == {"a": "unloaded", "b": "loaded"}
        await pool.close()

    _run(test)


def test_memory_budget_evicts_until_the_new_model_fits() -> None:
    loads = Loads()

    async def test() -> None:
        specs = [loads.spec("a", 60), loads.spec("b", 30), loads.spec("c", 50)]
        pool = _pool(specs, PoolLimits(memory_bytes=100))
        for name in ("a", "b"):
            async with pool.use(name):
                pass
        assert _status(pool) == {"a": "loaded", "b": "loaded", "c": "unloaded"}
        async with pool.use("c"):  # 90 + 50 > 100: a (least recently used) goes, 80 fits
            pass
        assert _status(pool) == {"a": "unloaded", "b": "loaded", "c": "loaded"}
        await pool.close()

    _run(test)


def test_idle_unload_frees_an_idle_model_and_the_next_request_loads_it_again() -> None:
    loads = Loads()

    async def test() -> None:
        pool = _pool([loads.spec("a")], PoolLimits(idle_unload=0.2))
        pool.start()
        async with pool.use("a") as engine:
            await _generate(engine)
        deadline = time.monotonic() + 5
        while not loads.stopped and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert _status(pool)["a"] == "unloaded" and loads.stopped == ["a"]
        async with pool.use("a") as engine:
            assert await _generate(engine) == "abcd"
        assert len(loads.engines["a"]) == 2
        await pool.close()

    _run(test)


def test_a_failed_load_is_a_400_and_the_others_keep_serving() -> None:
    loads = Loads()

    async def test() -> None:
        pool = _pool([loads.spec("bad", fail=True), loads.spec("a")], PoolLimits(max_loaded=1))
        with pytest.raises(errors.APIError) as info:
            async with pool.use("bad"):
                pass
        assert info.value.status == 400 and info.value.code == "model_load_failed"
        assert "not a GGUF file" in info.value.message
        [bad] = [m for m in pool.states() if m.name == "bad"]
        assert bad.status == "failed" and "not a GGUF file" in bad.error
        async with pool.use("a") as engine:
            assert await _generate(engine) == "abcd"
        await pool.close()

    _run(test)


def test_the_app_over_a_pool_lists_models_and_answers_by_name() -> None:
    loads = Loads()
    specs = [loads.spec("a"), loads.spec("b"), loads.spec("broken", fail=True)]
    app = create_app(ServerConfig(), None, models=specs, limits=PoolLimits(max_loaded=1))
    with TestClient(app) as client:
        health = client.get("/health")
        assert health.status_code == 200
        assert health.json()["models"] == {"a": "unloaded", "b": "unloaded", "broken": "unloaded"}
        cards = client.get("/v1/models").json()["data"]
        assert [(c["id"], c["status"]["value"]) for c in cards] == [
            ("a", "unloaded"), ("b", "unloaded"), ("broken", "unloaded")]  # fmt: skip
        r = client.post("/v1/completions", json={"model": "b", "prompt": "x", "max_tokens": 3})
        assert r.status_code == 200 and r.json()["model"] == "b"
        assert r.json()["choices"][0]["text"] == "abc"
        card = client.get("/v1/models/b").json()
        assert card["status"]["value"] == "loaded" and card["max_model_len"] == 64
        r = client.post("/v1/completions", json={"model": "zzz", "prompt": "x"})
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
        assert client.get("/v1/models/zzz").status_code == 404
        r = client.post("/v1/completions", json={"prompt": "x"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "model"
        r = client.post("/v1/completions", json={"model": "broken", "prompt": "x"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "model_load_failed"
        r = client.post("/v1/chat/completions",
                        json={"model": "a", "messages": [{"role": "user", "content": "x"}]})  # fmt: skip
        assert r.status_code == 200 and r.json()["model"] == "a"
        states = {c["id"]: c["status"] for c in client.get("/v1/models").json()["data"]}
        assert states["a"] == {"value": "loaded"} and states["b"] == {"value": "unloaded"}
        assert states["broken"]["value"] == "failed" and "GGUF" in states["broken"]["error"]
        metrics = client.get("/metrics").text
        assert 'vllm:num_requests_running{model_name="a"}' in metrics
        assert 'vllm:num_requests_running{model_name="b"}' not in metrics  # its engine is gone
        assert 'vllm:prompt_tokens_total{model_name="b"}' in metrics  # its counters stay


def test_a_model_whose_engine_died_loads_again() -> None:
    loads = Loads()

    async def test() -> None:
        pool = _pool([loads.spec("a")], PoolLimits())
        async with pool.use("a"):
            pass
        loads.engines["a"][0].errored = True
        assert _status(pool)["a"] == "failed"
        async with pool.use("a") as engine:
            assert await _generate(engine) == "abcd"
        assert len(loads.engines["a"]) == 2 and loads.stopped == ["a"]
        await pool.close()

    _run(test)


def test_the_single_model_server_unloads_when_idle_and_loads_again() -> None:
    """The pool of one with --idle-unload: /v1/models and /health say unloaded (200), the next
    request loads it again."""
    loads = Loads()
    spec = loads.spec("one")
    app = create_app(ServerConfig(), spec.load, limits=PoolLimits(idle_unload=0.2))
    with TestClient(app) as client:
        deadline = time.monotonic() + 10
        while client.get("/health").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert client.get("/v1/models").json()["data"][0]["status"] == {"value": "loaded"}
        while client.get("/health").json()["models"] != {"fake-model": "unloaded"}:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        [card] = client.get("/v1/models").json()["data"]
        assert card["id"] == "fake-model" and card["status"] == {"value": "unloaded"}
        r = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == "ab"
        assert len(loads.engines["one"]) == 2 and loads.stopped == ["one"]
