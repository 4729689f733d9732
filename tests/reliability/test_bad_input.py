"""Client mistakes against the real server: each is a 4xx in OpenAI's envelope whose message (or
`param`) says what to fix, nothing reaches the engine, and the server stays healthy."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from bench.common.server import Server
from tests.reliability.conftest import BODY_LIMIT, TEMPLATE_TRIGGERS, assert_envelope, wait_idle

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
HI = [{"role": "user", "content": "hi"}]
JSON = {"content-type": "application/json"}
VOCAB = 49152  # SmolLM2's vocabulary


@pytest.fixture(scope="module")
def client(rserver: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=rserver.base_url, timeout=120) as c:
        yield c


def _post_raw(client: httpx.Client, path: str, body: bytes) -> dict[str, Any]:
    return assert_envelope(client.post(path, content=body, headers=JSON))


def _chat(client: httpx.Client, **fields: Any) -> dict[str, Any]:
    body = {"messages": HI, "max_tokens": 1, **fields}
    return assert_envelope(client.post(CHAT, json=body))


def _completion(client: httpx.Client, **fields: Any) -> dict[str, Any]:
    body = {"prompt": "hi", "max_tokens": 1, **fields}
    return assert_envelope(client.post(COMPLETIONS, json=body))


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b'{"messages": [', "not valid JSON"),
        (b"", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b'{"prompt": "hi", "max_tokens": 1, "temperature": NaN}', "not valid JSON"),
        (b'{"prompt": "hi", "temperature": 1e999}', "not valid JSON"),
        (b'{"prompt": "\\ud800"}', "not valid JSON"),  # a lone surrogate escape
        (b'{"prompt": "caf\xe9"}', "UTF-8"),  # latin-1 bytes
        (b'{"prompt": "\xff\xfe\x00"}', "UTF-8"),
    ],
)
def test_unparseable_body(client: httpx.Client, body: bytes, says: str) -> None:
    error = _post_raw(client, COMPLETIONS, body)
    assert says in error["message"] and error["type"] == "invalid_request_error"


@pytest.mark.parametrize("depth", [2_000, 100_000])
def test_deeply_nested_json(client: httpx.Client, depth: int) -> None:
    arrays = b'{"prompt": ' + b"[" * depth + b"]" * depth + b"}"
    objects = b'{"prompt": ' + b'{"a": ' * depth + b"1" + b"}" * depth + b"}"
    for body in (arrays, objects):
        error = _post_raw(client, COMPLETIONS, body)
        assert "depth" in error["message"]


def test_body_over_the_limit(client: httpx.Client) -> None:
    ten_mb = orjson.dumps({"prompt": "hello " * (10 * 1024 * 1024 // 6), "max_tokens": 1})
    assert len(ten_mb) > 10_000_000 > BODY_LIMIT
    response = client.post(COMPLETIONS, content=ten_mb, headers=JSON)
    error = assert_envelope(response)
    assert response.status_code == 413 and str(BODY_LIMIT) in error["message"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit is counted while reading
        for _ in range(10):
            yield b" " * (1024 * 1024)

    response = client.post(COMPLETIONS, content=chunks(), headers=JSON)
    assert response.status_code == 413 and assert_envelope(response)["code"] == "request_too_large"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ({"messages": [{"content": "x"}]}, "messages[0].role"),
        ({"temperature": "hot"}, "temperature"),
        ({"n": "two"}, "n"),
        ({"stop": 5}, "stop"),
        ({"max_tokens": 1.5}, "max_tokens"),
        ({"max_tokens": 10**30}, "max_tokens"),
        ({"logit_bias": {"hello": 1}}, "logit_bias"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"tools": [{"type": "function"}]}, "tools[0].function"),
        ({"frobnicate": True}, "frobnicate"),
    ],
)
def test_wrong_types_and_fields(client: httpx.Client, fields: dict, param: str) -> None:
    error = _chat(client, **fields)
    assert error["param"] == param, error
    assert param.split("[")[0] in error["message"]


@pytest.mark.parametrize(
    "fields", [{"max_tokens": "5"}, {"stream": "yes"}, {"stream": 0.0}, {"logprobs": 1}]
)
def test_coercible_wrong_types(client: httpx.Client, fields: dict) -> None:
    error = _chat(client, **fields)
    assert error["param"] == next(iter(fields))


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        ([], "messages"),
        ([{"role": "wizard", "content": "x"}], "messages[0].role"),
        ([{"role": "tool", "content": "x"}], "messages[0]"),
        ([{"role": "user"}], "messages[0].content"),
        (
            [{"role": "system", "content": None}, {"role": "user", "content": "x"}],
            "messages[0].content",
        ),
        (
            [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
            "messages[0].content[0].image_url",
        ),  # fmt: skip
    ],
)
def test_bad_messages(client: httpx.Client, messages: list, param: str) -> None:
    error = _chat(client, messages=messages)
    assert error["param"] == param


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_nul_inside_strings(client: httpx.Client, path: str) -> None:
    if path == CHAT:
        error = _chat(client, messages=[{"role": "user", "content": "a\u0000b"}])
    else:
        error = _completion(client, prompt="a\u0000b")
    assert "NUL" in error["message"] or "null" in error["message"]


@pytest.mark.parametrize("prompt", ["", [], [[]], ["hi", ""]])
def test_zero_token_prompt(client: httpx.Client, prompt: Any) -> None:
    error = _completion(client, prompt=prompt)
    assert error["param"] == "prompt" and "empty" in error["message"]


@pytest.mark.parametrize("prompt", [[1, VOCAB], [-1], [[5, 2**40]], [[1], [VOCAB + 7]]])
def test_token_ids_outside_the_vocabulary(client: httpx.Client, prompt: list) -> None:
    error = _completion(client, prompt=prompt)
    assert error["param"] == "prompt" and f"[0, {VOCAB})" in error["message"]


@pytest.mark.parametrize("ids", [[VOCAB], [-1], [2, 2**40]])
def test_stop_token_ids_outside_the_vocabulary(client: httpx.Client, ids: list[int]) -> None:
    error = _completion(client, stop_token_ids=ids)
    assert error["param"] == "stop_token_ids" and f"[0, {VOCAB})" in error["message"]


def test_detokenize_outside_the_vocabulary(client: httpx.Client) -> None:
    error = assert_envelope(client.post("/detokenize", json={"tokens": [1, 10**12]}))
    assert error["param"] == "tokens" and f"[0, {VOCAB})" in error["message"]


@pytest.mark.parametrize(
    ("path", "max_tokens", "says"),
    [
        (CHAT, 0, "greater than or equal to 1"),
        (CHAT, -1, "greater than or equal to 1"),
        (COMPLETIONS, 0, "only with echo"),
        (COMPLETIONS, -5, "greater than or equal to 0"),
        (CHAT, 10**6, "maximum context length"),
        (COMPLETIONS, 2**62, "maximum context length"),
    ],
)
def test_max_tokens_out_of_range(
    client: httpx.Client, path: str, max_tokens: int, says: str
) -> None:
    post = _chat if path == CHAT else _completion
    error = post(client, max_tokens=max_tokens)
    assert says in error["message"]
    assert error["param"] in ("max_tokens", "messages", "prompt")
    if "context length" in says:
        assert error["code"] == "context_length_exceeded"


@pytest.mark.parametrize("n", [0, 129, 10**6, -3])
def test_n_out_of_range(client: httpx.Client, n: int) -> None:
    error = _chat(client, n=n)
    assert error["param"] == "n" and "n:" in error["message"]


def test_stop_list_too_long(client: httpx.Client) -> None:
    error = _chat(client, stop=[f"s{i}" for i in range(100)])
    assert error["param"] == "stop" and "16" in error["message"]


@pytest.mark.parametrize(
    ("path", "fields", "param"),
    [
        (CHAT, {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        (CHAT, {"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
        (CHAT, {"top_logprobs": 3}, "top_logprobs"),  # without logprobs
        (COMPLETIONS, {"logprobs": 21}, "logprobs"),
        (COMPLETIONS, {"logprobs": -1}, "logprobs"),
    ],
)
def test_logprobs_out_of_range(client: httpx.Client, path: str, fields: dict, param: str) -> None:
    post = _chat if path == CHAT else _completion
    error = post(client, **fields)
    assert error["param"] == param and param in error["message"]


# OpenAI's ranges (temperature [0, 2], top_p (0, 1], penalties [-2, 2], logit_bias values
# [-100, 100]) and vLLM's for its extensions; the edges themselves are accepted.
SAMPLING_RANGES = {
    "temperature": ([-0.1, 2.5, 1e300], [0, 2]),
    "top_p": ([0, -0.5, 1.01], [1e-9, 1]),
    "presence_penalty": ([-2.01, 2.5], [-2, 2]),
    "frequency_penalty": ([-3, 2.01], [-2, 2]),
    "top_k": ([-2], [-1, 0, 5]),
    "min_p": ([-0.1, 1.5], [0, 1]),
    "repetition_penalty": ([0, -1], [0.5, 2]),
}


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
@pytest.mark.parametrize("field", sorted(SAMPLING_RANGES))
def test_sampling_values_outside_their_range(client: httpx.Client, path: str, field: str) -> None:
    post = _chat if path == CHAT else _completion
    bad, edges = SAMPLING_RANGES[field]
    for value in bad:
        error = post(client, **{field: value})
        assert error["param"] == field and field in error["message"], (value, error)
    body = {"max_tokens": 1, **({"messages": HI} if path == CHAT else {"prompt": "hi"})}
    for value in edges:
        r = client.post(path, json={**body, field: value})
        assert r.status_code == 200, (field, value, r.text)


def test_logit_bias_value_outside_its_range(client: httpx.Client) -> None:
    for value in (-100.5, 101):
        error = _chat(client, logit_bias={"42": value})
        assert error["param"] == "logit_bias.42" and "logit_bias" in error["message"]


@pytest.mark.parametrize("trigger", TEMPLATE_TRIGGERS)
def test_chat_template_cannot_reach_python_internals(client: httpx.Client, trigger: str) -> None:
    error = _chat(client, messages=[{"role": "user", "content": trigger}])
    assert error["param"] == "messages" and "unsafe" in error["message"]
    assert "uid=" not in error["message"] and "subclasses" not in error["message"]


def test_healthy_after_bad_input(rserver: Server, client: httpx.Client) -> None:
    for trigger in TEMPLATE_TRIGGERS:  # the template refused above still renders other chats
        _chat(client, messages=[{"role": "user", "content": trigger}])
    response = client.post(CHAT, json={"messages": HI, "max_tokens": 2})
    assert response.status_code == 200
    assert response.json()["choices"][0]["finish_reason"] in ("stop", "length")
    assert client.get("/health").status_code == 200
    assert not any(wait_idle(rserver).values())
    assert "Traceback" not in rserver.log()


@pytest.mark.parametrize("path", ["/tokenize", COMPLETIONS, CHAT])
def test_huge_prompt_does_not_stall_other_requests(rserver: Server, path: str) -> None:
    """A prompt of megabytes takes seconds to tokenize; it happens off the event loop, so
    /health keeps answering meanwhile (a blocked loop answers none until it is done)."""
    text = "The quick brown fox jumps over the lazy dog. " * (BODY_LIMIT // 60)
    body: dict[str, Any] = {"prompt": text, "max_tokens": 1}
    if path == "/tokenize":
        body = {"prompt": text}
    elif path == CHAT:
        body = {"messages": [{"role": "user", "content": text}], "max_tokens": 1}
    result: dict[str, Any] = {}

    def big() -> None:
        with httpx.Client(base_url=rserver.base_url, timeout=120) as c:
            result["response"] = c.post(path, json=body)

    worker = threading.Thread(target=big)
    answered = 0
    with httpx.Client(base_url=rserver.base_url, timeout=120) as c:
        worker.start()
        while worker.is_alive():
            response = c.get("/health")
            answered += worker.is_alive() and response.status_code == 200
            time.sleep(0.02)
    response = result["response"]
    if path == "/tokenize":
        assert response.status_code == 200 and response.json()["count"] > 100_000
    else:
        assert assert_envelope(response)["code"] == "context_length_exceeded"
    assert answered >= 5, f"/health answered {answered} times while the prompt was tokenized"
