"""Overload and shutdown on a small server (2 running, 4 waiting): with both seats held by two
long streams, a burst of 40 gets exactly 4 into the queue and 36 refusals (429 with Retry-After)
before any accepted one finishes; accepted ones complete, everything drains; then SIGTERM with
streams in flight lets them finish, refuses new connections, and exits 0."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from bench.common.server import (
    Server,
    check_completion_stream,
    parse_sse,
    start_server,
    stop_server,
)
from tests.reliability.conftest import assert_envelope, wait_idle

MAX_WAITING = 4
MAX_NUM_SEQS = 2
NUM_REQUESTS = 40
MAX_TOKENS = 12
HOLD_TOKENS = 240
"""Long enough (seconds of decoding) that the holders keep both seats while the burst arrives."""


@pytest.fixture(scope="module")
def small_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    flags = ["--max-model-len", "256", "--num-pages", "64", "--max-num-seqs", str(MAX_NUM_SEQS),
             "--max-waiting", str(MAX_WAITING), "--graceful-timeout", "60"]  # fmt: skip
    srv = start_server(tmp_path_factory.mktemp("small"), *flags)
    yield srv
    stop_server(srv)  # test_graceful_shutdown normally stopped it already


async def _one(client: httpx.AsyncClient, i: int) -> tuple[httpx.Response, bytes, float]:
    body = {"prompt": f"Item {i}:", "max_tokens": MAX_TOKENS, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    async with client.stream("POST", "/v1/completions", json=body) as response:
        raw = await response.aread()
    return response, raw, time.monotonic()


async def _hold(client: httpx.AsyncClient, i: int, seated: asyncio.Event, leave: asyncio.Event):
    """A long stream that holds a running seat until `leave` (then disconnects, freeing it)."""
    body = {"prompt": f"Hold {i}:", "max_tokens": HOLD_TOKENS, "ignore_eos": True,
            "stream": True}  # fmt: skip
    async with client.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith('data: {"id"'):
                seated.set()
            if leave.is_set():
                return
    raise AssertionError("a holder finished before the burst was refused: raise HOLD_TOKENS")


async def _burst(server: Server) -> list[tuple[httpx.Response, bytes, float]]:
    """Both seats held (each holder has a token), then 40 requests at once: the queue takes 4,
    the rest must be refused. Once 36 have answered, the holders leave and the 4 run."""
    limits = httpx.Limits(max_connections=NUM_REQUESTS + MAX_NUM_SEQS)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=300, limits=limits) as c:
        seated = [asyncio.Event() for _ in range(MAX_NUM_SEQS)]
        leave = asyncio.Event()
        holders = [asyncio.ensure_future(_hold(c, i, e, leave)) for i, e in enumerate(seated)]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in seated)), 120)
        burst = [asyncio.ensure_future(_one(c, i)) for i in range(NUM_REQUESTS)]
        while sum(t.done() for t in burst) < NUM_REQUESTS - MAX_WAITING:
            if any(h.done() for h in holders):
                break  # a holder failed: its exception is raised by the gather below
            await asyncio.sleep(0.02)
        leave.set()
        await asyncio.gather(*holders)
        return await asyncio.gather(*burst)


Burst = list[tuple[httpx.Response, bytes, float]]


@pytest.fixture(scope="module")
def burst(small_server: Server) -> Burst:
    return asyncio.run(_burst(small_server))


def _refused_in_stream(raw: bytes) -> bool:
    return b'"queue_full"' in raw


def test_overload_refuses_with_429_not_a_stream(burst: Burst) -> None:
    assert not [raw for r, raw, _ in burst if r.status_code == 200 and _refused_in_stream(raw)]


def test_overload_accepted_complete_and_drain(small_server: Server, burst: Burst) -> None:
    accepted = [(raw, t) for r, raw, t in burst if r.status_code == 200]
    served = [(raw, t) for raw, t in accepted if not _refused_in_stream(raw)]
    refused = [(r, t) for r, _, t in burst if r.status_code != 200]
    assert len(served) == MAX_WAITING, [r.status_code for r, _, _ in burst]
    assert len(refused) == NUM_REQUESTS - MAX_WAITING, [r.status_code for r, _, _ in burst]
    for response, _ in refused:
        assert response.status_code == 429
        assert int(response.headers["retry-after"]) >= 1
        assert assert_envelope(response)["code"] == "queue_full"
    for raw, _ in served:
        check_completion_stream(parse_sse(raw), MAX_TOKENS)
    # "Quickly": every refusal came back before the first served request had finished.
    assert max(t for _, t in refused) < min(t for _, t in served)
    assert not any(wait_idle(small_server).values())
    after = httpx.post(small_server.base_url + "/v1/completions",
                       json={"prompt": "Again", "max_tokens": 2}, timeout=120)  # fmt: skip
    assert after.status_code == 200  # nothing stayed counted as waiting


def _stream(base_url: str, i: int, started: threading.Event) -> list:
    body = {"prompt": f"Count {i}:", "max_tokens": 24, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    raw = b""
    with httpx.stream("POST", base_url + "/v1/completions", json=body, timeout=300) as r:
        for chunk in r.iter_bytes():
            raw += chunk
            started.set()
    return parse_sse(raw)


def _refuses_new_requests(base_url: str, deadline_s: float = 20.0) -> bool:
    """True once a new connection is refused or answered 503 (the listener closes shortly
    after SIGTERM)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            with httpx.Client(timeout=5) as fresh:  # a new connection every try
                if fresh.get(base_url + "/v1/models").status_code == 503:
                    return True
        except httpx.ConnectError:
            return True
        time.sleep(0.1)
    return False


def test_graceful_shutdown(small_server: Server) -> None:
    events = [threading.Event() for _ in range(2)]
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(_stream, small_server.base_url, i, e) for i, e in enumerate(events)]
        assert all(e.wait(120) for e in events)
        small_server.process.send_signal(signal.SIGTERM)
        assert _refuses_new_requests(small_server.base_url)
        streams = [f.result(timeout=300) for f in futures]
    for payloads in streams:
        check_completion_stream(payloads, 24)
        assert payloads[-2]["usage"]["completion_tokens"] == 24  # finished, not cut off
    assert small_server.process.wait(120) == 0, small_server.log()[-3000:]
    assert "Traceback" not in small_server.log()
