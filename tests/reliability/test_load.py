"""Load against the real server: waves of concurrent streams, and clients that leave mid-stream.

Nothing may be lost: every stream is well formed, every KV page comes back, memory does not
creep from wave to wave, and abandoned requests stop costing engine work.
"""

from __future__ import annotations

import asyncio
import random

import httpx
import psutil

from bench.common.server import Server, check_completion_stream
from tests.reliability.conftest import stream_completion, wait_idle

NUM_STREAMS = 256
NUM_WAVES = 3
WAVE_MAX_TOKENS = 2
NUM_LEAVING = 100
NUM_STAYING = 28
LEAVING_MAX_TOKENS = 64
STAYING_MAX_TOKENS = 8
RSS_LIMIT = 0.05
UNAWAITED = ("Task was destroyed but it is pending", "was never awaited")


def _client(server: Server, connections: int) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    return httpx.AsyncClient(base_url=server.base_url, timeout=600, limits=limits)


async def _wave(server: Server, wave: int) -> list[list]:
    async with _client(server, NUM_STREAMS) as client:
        prompts = [f"Wave {wave}, request {i}: tell me" for i in range(NUM_STREAMS)]
        jobs = (stream_completion(client, p, WAVE_MAX_TOKENS) for p in prompts)
        return await asyncio.gather(*jobs)


def test_three_waves_of_256_streams(rserver: Server) -> None:
    process = psutil.Process(rserver.process.pid)
    rss: list[int] = []
    for wave in range(NUM_WAVES):
        results = asyncio.run(_wave(rserver, wave))
        assert len(results) == NUM_STREAMS
        for payloads in results:
            check_completion_stream(payloads, WAVE_MAX_TOKENS)
        busy = wait_idle(rserver)
        assert not any(busy.values()), f"wave {wave} left work or pages behind: {busy}"
        rss.append(process.memory_info().rss)
    growth = rss[-1] / rss[0] - 1
    print(f"RSS after each wave: {[r >> 20 for r in rss]} MiB (+{growth:.1%})")  # for -rP
    assert growth < RSS_LIMIT, f"RSS after each wave: {[r >> 20 for r in rss]} MiB (+{growth:.1%})"


async def _leave_early(client: httpx.AsyncClient, rng: random.Random, i: int) -> int:
    """Stream a long completion and disconnect after a random number of frames (0: right
    after the headers). Returns the number of frames read."""
    body = {"prompt": f"Story {i}:", "max_tokens": LEAVING_MAX_TOKENS, "ignore_eos": True,
            "stream": True}  # fmt: skip
    keep = rng.randint(0, 10)
    await asyncio.sleep(rng.uniform(0, 0.5))
    seen = 0
    async with client.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if seen >= keep:
                break
            seen += line.startswith("data: ")
    return seen  # leaving the block closes the connection


async def _mixed(server: Server) -> tuple[list[int], list[list]]:
    rng = random.Random(6)
    async with _client(server, NUM_LEAVING + NUM_STAYING) as client:
        leaving = [_leave_early(client, rng, i) for i in range(NUM_LEAVING)]
        staying = [stream_completion(client, f"Poem {i}:", STAYING_MAX_TOKENS)
                   for i in range(NUM_STAYING)]  # fmt: skip
        results = await asyncio.gather(*leaving, *staying)
    return list(results[:NUM_LEAVING]), list(results[NUM_LEAVING:])


def _ended(server: Server) -> dict[str, float]:
    """vllm:request_success_total by finished_reason, and the generated tokens."""
    samples = server.metrics()
    ended = {"tokens": samples[f'vllm:generation_tokens_total{{model_name="{server.model}"}}']}
    for reason in ("abort", "length", "stop", "error"):
        key = (
            f'vllm:request_success_total{{finished_reason="{reason}",model_name="{server.model}"}}'
        )
        ended[reason] = samples.get(key, 0.0)
    return ended


def test_random_disconnects_lose_nothing(rserver: Server) -> None:
    before = _ended(rserver)
    log_before = len(rserver.log())
    frames_read, finished = asyncio.run(_mixed(rserver))
    for payloads in finished:
        text = check_completion_stream(payloads, STAYING_MAX_TOKENS)
        assert payloads[-2]["usage"]["completion_tokens"] == STAYING_MAX_TOKENS, text
    busy = wait_idle(rserver)
    assert not any(busy.values()), f"aborted requests left work or pages behind: {busy}"
    ended = {k: v - before[k] for k, v in _ended(rserver).items()}
    # Every request ended exactly once, counted by the engine: the normal ones by length, the
    # abandoned ones by abort (or by length when one outran its client's disconnect).
    assert ended["abort"] + ended["length"] == NUM_LEAVING + NUM_STAYING, (ended, frames_read)
    assert ended["stop"] == ended["error"] == 0, ended
    assert ended["abort"] >= NUM_LEAVING * 0.9, (ended, frames_read)
    # The generation counter includes the aborted requests' tokens (as vLLM's does): they
    # stopped costing work when their clients left, far fewer tokens than if they had all run.
    everything = NUM_LEAVING * LEAVING_MAX_TOKENS + NUM_STAYING * STAYING_MAX_TOKENS
    assert NUM_STAYING * STAYING_MAX_TOKENS < ended["tokens"] < everything / 2, ended
    log = rserver.log()[log_before:]
    assert not [w for w in UNAWAITED if w in log], log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    assert httpx.get(rserver.base_url + "/health", timeout=10).status_code == 200
