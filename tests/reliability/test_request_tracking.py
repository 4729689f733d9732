"""What an operator reads about one request on the real server: the running/waiting gauges
count it from admission, and its X-Request-Id is on its response and on its log lines (the
access log included)."""

from __future__ import annotations

import re
import time

import httpx

from bench.common.server import Server
from tests.reliability.conftest import wait_idle

LONG = 200  # tokens: the request is still running when the test looks


def _in_flight(server: Server) -> float:
    """Running + waiting from one scrape: read in two, a request that moves from waiting to
    running between them is counted in neither (this test failed 1 run in 9 that way)."""
    samples = server.metrics()
    return server.metric("vllm:num_requests_running", samples) + server.metric(
        "vllm:num_requests_waiting", samples
    )


def test_gauges_count_a_request_from_its_first_chunk(rserver: Server) -> None:
    """The chat stream's first chunk (the assistant role) is sent on admission, before the
    engine has stepped: the gauges must already count the request."""
    assert not any(wait_idle(rserver).values())
    body = {"messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": LONG,
            "ignore_eos": True, "stream": True}  # fmt: skip
    with httpx.stream("POST", rserver.base_url + "/v1/chat/completions", json=body,
                      timeout=60) as response:  # fmt: skip
        # `lines` keeps the stream open: a dropped line iterator closes the connection.
        lines = response.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        assert '"role":"assistant"' in first
        assert _in_flight(rserver) >= 1
    assert not any(wait_idle(rserver).values())


def _lines_of(server: Server, request_id: str, deadline_s: float = 10.0) -> list[str]:
    """The log lines stamped with this id, once its access line is there."""
    deadline = time.monotonic() + deadline_s
    while True:
        lines = [ln for ln in server.log().splitlines() if f"[{request_id}]" in ln]
        if any("pagedserve.access" in ln for ln in lines) or time.monotonic() > deadline:
            return lines
        time.sleep(0.05)


def test_request_id_on_the_response_and_every_log_line(rserver: Server) -> None:
    url = rserver.base_url + "/v1/completions"
    body = {"prompt": "Count:", "max_tokens": LONG, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", url, json=body, headers={"X-Request-Id": "rt-left-1"}) as r:
        assert r.headers["x-request-id"] == "rt-left-1"
        next(line for line in r.iter_lines() if line.startswith("data: "))
    # the client left mid-stream: the disconnect line and the access line carry its id
    lines = _lines_of(rserver, "rt-left-1")
    assert any("client disconnected mid-stream" in ln for ln in lines), lines
    access = [ln for ln in lines if "pagedserve.access" in ln]
    assert len(access) == 1 and re.search(r'"POST /v1/completions" 200 \d+\.\d+s', access[0])

    bad = httpx.post(url, json={"prompt": "x", "n": 0}, headers={"X-Request-Id": "rt-400"})
    assert bad.status_code == 400 and bad.headers["x-request-id"] == "rt-400"
    [line] = _lines_of(rserver, "rt-400")
    assert '"POST /v1/completions" 400' in line

    generated = httpx.get(rserver.base_url + "/health").headers["x-request-id"]
    assert re.fullmatch(r"[0-9a-f]{32}", generated)
    assert any('"GET /health" 200' in ln for ln in _lines_of(rserver, generated))
    assert not any(wait_idle(rserver).values())
