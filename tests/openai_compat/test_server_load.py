"""64 concurrent streams, and a client that disconnects mid-stream has its pages freed."""

from __future__ import annotations

import asyncio
import time

import httpx
import orjson

from bench.common.server import API_KEY, Server

HEADERS = {"Authorization": f"Bearer {API_KEY}"}


async def _stream_one(client: httpx.AsyncClient, server: Server, i: int) -> list[dict]:
    body = {"model": server.model, "messages": [{"role": "user", "content": f"Number {i}?"}],
            "max_tokens": 4, "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    chunks: list[dict] = []
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                data = line.removeprefix("data: ")
                chunks.append({"done": True} if data == "[DONE]" else orjson.loads(data))
    return chunks


def test_64_concurrent_streams(server: Server) -> None:
    async def run() -> list[list[dict]]:
        limits = httpx.Limits(max_connections=64)
        async with httpx.AsyncClient(base_url=server.base_url, headers=HEADERS, timeout=600,
                                     limits=limits) as client:  # fmt: skip
            return await asyncio.gather(*(_stream_one(client, server, i) for i in range(64)))

    results = asyncio.run(run())
    assert len(results) == 64
    for chunks in results:
        assert chunks[-1] == {"done": True}
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
        assert len({c["id"] for c in chunks[:-1]}) == 1
        usage = chunks[-2]
        assert usage["choices"] == [] and 1 <= usage["usage"]["completion_tokens"] <= 4
        reasons = [c["choices"][0]["finish_reason"] for c in chunks[1:-2]]
        assert reasons[-1] in ("stop", "length") and not any(reasons[:-1])


def _wait_for_idle(server: Server, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while _busy(server) and time.monotonic() < deadline:
        time.sleep(0.2)


def _busy(server: Server) -> float:
    return server.metric("pagedserve:kv_pages_used") + server.metric("vllm:num_requests_running")


def _aborted(server: Server) -> tuple[float, float]:
    """(aborted requests, all generated tokens) as the engine counts them."""
    samples = server.metrics()
    key = f'vllm:request_success_total{{finished_reason="abort",model_name="{server.model}"}}'
    return samples.get(key, 0.0), server.metric("vllm:generation_tokens_total")


MAX_TOKENS = 500
FRAMES_READ = 11


def test_disconnect_frees_pages(server: Server) -> None:
    """The pages come back within half the time the request would have needed to finish on its
    own (measured from its own frame rate), and the engine counts it aborted after a fraction
    of its tokens."""
    body = {"model": server.model, "prompt": "Once upon a time", "max_tokens": MAX_TOKENS,
            "ignore_eos": True, "stream": True}  # fmt: skip
    _wait_for_idle(server)  # nothing of an earlier test is still counting
    aborted_before, tokens_before = _aborted(server)
    with httpx.Client(base_url=server.base_url, headers=HEADERS, timeout=120) as client:
        with client.stream("POST", "/v1/completions", json=body) as response:
            # Held in a name: a line iterator that is dropped (a `for` left by `break`, a
            # generator expression) is closed at once, and closes the connection with it.
            lines, stamps = response.iter_lines(), []
            while len(stamps) < FRAMES_READ:
                if next(lines).startswith("data: "):
                    stamps.append(time.monotonic())
            assert server.metric("pagedserve:kv_pages_used") > 0
            assert server.metric("vllm:num_requests_running") == 1
        # leaving the block closes the connection mid-stream
    left = time.monotonic()
    seconds_per_frame = (stamps[-1] - stamps[0]) / (FRAMES_READ - 1)
    # Read as they come, frames carry one token each (more only when the reader lags, which
    # lengthens this estimate, never shortens it).
    on_its_own = (MAX_TOKENS - FRAMES_READ) * seconds_per_frame
    deadline = left + on_its_own / 2
    while _busy(server) and time.monotonic() < deadline:
        time.sleep(0.02)
    waited = time.monotonic() - left
    assert not _busy(server), f"not freed {waited:.2f}s after leaving ({on_its_own:.2f}s)"
    assert server.metric("vllm:kv_cache_usage_perc") == 0
    aborted, tokens = _aborted(server)
    assert aborted - aborted_before == 1
    assert tokens - tokens_before < MAX_TOKENS / 2, (tokens - tokens_before, waited)
