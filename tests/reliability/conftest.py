"""A real server for the reliability tests, and the checks they share.

One session-wide server (started with a chat template that tries to reach Python internals on
trigger words, so the sandbox can be tested without a second process) serves the fuzzing,
bad-input and load tests. Its flags match what a client mistake should meet in production:
a 2 MiB body limit, a small context and KV cache so that load tests finish quickly, and the
access log on.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from bench.common.server import (
    Server,
    parse_sse,
    start_server,
    stop_server,
)

NUM_PAGES = 512
MAX_MODEL_LEN = 1024
BODY_LIMIT = 2 * 1024 * 1024

# A ChatML template with three classic server-side template injection attempts, each taken only
# when the first message is its trigger word; any other message renders normally.
EVIL_TEMPLATE = """\
{%- if messages[0]['content'] == 'reach-mro' -%}
{{ ''.__class__.__mro__[1].__subclasses__() }}
{%- elif messages[0]['content'] == 'reach-globals' -%}
{{ cycler.__init__.__globals__.os.popen('id').read() }}
{%- elif messages[0]['content'] == 'reach-format' -%}
{{ '{0.__class__.__init__.__globals__}'.format(messages) }}
{%- endif -%}
{%- for m in messages -%}
<|im_start|>{{ m['role'] }}
{{ m['content'] }}<|im_end|>
{% endfor -%}
{%- if add_generation_prompt -%}
<|im_start|>assistant
{% endif -%}
"""
TEMPLATE_TRIGGERS = ("reach-mro", "reach-globals", "reach-format")


@pytest.fixture(scope="session")
def rserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp_dir = tmp_path_factory.mktemp("reliability")
    template = tmp_dir / "evil.jinja"
    template.write_text(EVIL_TEMPLATE)
    flags = ["--max-model-len", str(MAX_MODEL_LEN), "--num-pages", str(NUM_PAGES),
             "--max-num-seqs", "64", "--chat-template", str(template),
             "--max-body-bytes", str(BODY_LIMIT), "--access-log"]  # fmt: skip
    srv = start_server(tmp_dir, *flags)
    yield srv
    code = stop_server(srv)
    assert code == 0, srv.log()


def assert_envelope(response: httpx.Response) -> dict[str, Any]:
    """A 4xx in OpenAI's error envelope; returns the inner error object."""
    assert 400 <= response.status_code < 500, (response.status_code, response.text[:500])
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"], error
    assert isinstance(error["type"], str) and error["type"], error
    assert error["param"] is None or isinstance(error["param"], str), error
    assert error["code"] is None or isinstance(error["code"], str), error
    return error


def wait_idle(server: Server, timeout_s: float = 60.0) -> dict[str, float]:
    """Poll /metrics until no page is used and nothing runs or waits (or the timeout)."""
    deadline = time.monotonic() + timeout_s
    while True:
        samples = server.metrics()  # one scrape: the three gauges of one moment
        busy = {
            name: server.metric(name, samples)
            for name in (
                "pagedserve:kv_pages_used",
                "vllm:num_requests_running",
                "vllm:num_requests_waiting",
            )  # fmt: skip
        }
        if not any(busy.values()) or time.monotonic() > deadline:
            return busy
        time.sleep(0.2)


async def stream_completion(client: httpx.AsyncClient, prompt: str, max_tokens: int) -> list[Any]:
    body = {"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
            "temperature": 0, "stream_options": {"include_usage": True}}  # fmt: skip
    async with client.stream("POST", "/v1/completions", json=body) as response:
        raw = await response.aread()
    assert response.status_code == 200, raw[:500]
    assert response.headers["content-type"].startswith("text/event-stream")
    return parse_sse(raw)


def run(coro: Any) -> Any:
    return asyncio.run(coro)
