"""64 concurrent streams, and a client that disconnects mid-stream has its pages freed."""

from __future__ import annotations

import asyncio
import time

import httpx
import orjson

from tests.openai_compat.conftest import API_KEY, Server

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


def _wait_for_idle(server: Server, timeout_s: float = 60.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout_s
    while True:
        samples = server.metrics()
        used = sum(v for k, v in samples.items() if k.startswith("pagedserve:kv_pages_used"))
        running = sum(v for k, v in samples.items() if k.startswith("vllm:num_requests_running"))
        if (used == 0 and running == 0) or time.monotonic() > deadline:
            return samples
        time.sleep(0.2)


def test_disconnect_frees_pages(server: Server) -> None:
    body = {"model": server.model, "prompt": "Once upon a time", "max_tokens": 500,
            "ignore_eos": True, "stream": True}  # fmt: skip
    with httpx.Client(base_url=server.base_url, headers=HEADERS, timeout=120) as client:
        with client.stream("POST", "/v1/completions", json=body) as response:
            lines = response.iter_lines()
            got = [line for line, _ in zip(lines, range(6), strict=False) if line]
            assert got and got[0].startswith("data: ")
            assert server.metric("pagedserve:kv_pages_used") > 0
        # leaving the block closes the connection mid-stream
    samples = _wait_for_idle(server)
    used = sum(v for k, v in samples.items() if k.startswith("pagedserve:kv_pages_used"))
    usage = sum(v for k, v in samples.items() if k.startswith("vllm:kv_cache_usage_perc"))
    assert used == 0 and usage == 0
