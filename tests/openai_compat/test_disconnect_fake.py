"""Over real sockets (hypercorn in a thread, fake engine): shutdown drains streams in flight, and
a client that leaves mid-stream, or before a non-streaming answer is ready, has its engine
request closed (which aborts it)."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from hypercorn.asyncio import serve
from hypercorn.config import Config

from bench.common.server import free_port
from pagedserve.openai_compat.app import create_app
from pagedserve.openai_compat.server_config import ServerConfig
from tests.openai_compat.fake_engine import FakeEngine


class LiveServer:
    """hypercorn serving the app (fake engine) on its own event loop in a thread."""

    def __init__(self, engine: FakeEngine) -> None:
        config = Config()
        config.bind = [f"127.0.0.1:{free_port()}"]
        config.accesslog = None
        config.graceful_timeout = 30
        self.base = "http://" + config.bind[0]
        self.loop = asyncio.new_event_loop()
        self.stop_event = asyncio.Event()
        app = create_app(ServerConfig(), lambda: engine)
        main = serve(app, config, shutdown_trigger=self.stop_event.wait)
        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(main,))
        self.thread.start()
        _wait(lambda: httpx.get(self.base + "/health").status_code == 200, ignore=httpx.HTTPError)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.stop_event.set)

    def join(self) -> None:
        self.thread.join(30)
        self.loop.close()


@pytest.fixture(scope="module")
def live() -> Iterator[tuple[str, FakeEngine]]:
    engine = FakeEngine(token_delay=0.02)
    engine.model_info = dataclasses.replace(engine.model_info, max_model_len=10_000)
    server = LiveServer(engine)
    yield server.base, engine
    server.stop()
    server.join()


def _wait(cond, ignore: type[Exception] = Exception, timeout_s: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if cond():
                return
        except ignore:
            pass
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def test_stream_disconnect_aborts(live: tuple[str, FakeEngine]) -> None:
    base, engine = live
    body = {"prompt": "x", "max_tokens": 2000, "stream": True}
    with httpx.stream("POST", base + "/v1/completions", json=body, timeout=30) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")
        assert len(engine.active) == 1
    _wait(lambda: not engine.active)
    assert len(engine.aborted) == 1


def test_non_stream_disconnect_aborts(live: tuple[str, FakeEngine]) -> None:
    base, engine = live
    before = len(engine.aborted)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(base + "/v1/completions", json={"prompt": "x", "max_tokens": 2000}, timeout=0.5)
    _wait(lambda: not engine.active and len(engine.aborted) == before + 1)


def test_shutdown_finishes_streams_in_flight() -> None:
    engine = FakeEngine(token_delay=0.02)
    server = LiveServer(engine)
    body = {"prompt": "x", "max_tokens": 40, "stream": True}
    with httpx.stream("POST", server.base + "/v1/completions", json=body, timeout=30) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")
        server.stop()
        rest = [line for line in lines if line]
    server.join()
    assert not server.thread.is_alive()
    assert rest[-1] == "data: [DONE]" and len(rest) == 40  # 39 more tokens, then [DONE]
    assert not engine.aborted
