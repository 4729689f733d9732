"""Shapes and errors of the HTTP layer over a fake engine (fast; the real server is tested in
test_server_*.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import orjson
import pytest
from starlette.testclient import TestClient

from pagedserve.openai_compat.app import create_app
from pagedserve.openai_compat.server_config import ServerConfig
from tests.openai_compat.fake_engine import FakeEngine


def _wait_ready(client: TestClient) -> None:
    for _ in range(200):
        if client.get("/health").status_code == 200:
            return
        time.sleep(0.01)
    raise AssertionError("the app never became ready")


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def client(engine: FakeEngine) -> Iterator[TestClient]:
    app = create_app(ServerConfig(max_body_bytes=4096), lambda: engine)
    with TestClient(app) as client:
        _wait_ready(client)
        yield client


def sse(text: str) -> list[dict | str]:
    frames = [f.removeprefix("data: ") for f in text.split("\n\n") if f]
    return [f if f == "[DONE]" else orjson.loads(f) for f in frames]


def test_chat_completion_shape(client: TestClient) -> None:
    r = client.post("/v1/chat/completions", json={"model": "fake-model", "messages": [
        {"role": "user", "content": "hi"}], "max_tokens": 3})  # fmt: skip
    assert r.status_code == 200
    body = r.json()
    assert body["id"].startswith("chatcmpl-") and body["object"] == "chat.completion"
    assert body["model"] == "fake-model" and body["system_fingerprint"]
    assert body["choices"] == [{"index": 0, "message": {"role": "assistant", "content": "abc",
        "refusal": None}, "logprobs": None, "finish_reason": "length"}]  # fmt: skip
    prompt_len = len("<user>hi<assistant>")
    assert body["usage"]["prompt_tokens"] == prompt_len
    assert body["usage"]["completion_tokens"] == 3
    assert body["usage"]["total_tokens"] == prompt_len + 3


def test_chat_stream_chunks(client: TestClient) -> None:
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}],
        "max_tokens": 2, "n": 2, "stream": True, "stream_options": {"include_usage": True}})  # fmt: skip
    assert r.headers["content-type"].startswith("text/event-stream")
    frames = sse(r.text)
    assert frames[-1] == "[DONE]"
    chunks = frames[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert [c["choices"][0]["delta"] for c in chunks[:2]] == [
        {"role": "assistant", "content": ""}
    ] * 2
    usage = chunks[-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 4
    text = {0: "", 1: ""}
    reasons = {}
    for c in chunks[2:-1]:
        assert c["usage"] is None
        choice = c["choices"][0]
        text[choice["index"]] += choice["delta"].get("content", "")
        reasons[choice["index"]] = choice["finish_reason"]
    assert text == {0: "ab", 1: "ab"} and reasons == {0: "length", 1: "length"}


def test_chat_logprobs_shape(client: TestClient) -> None:
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}],
        "max_tokens": 1, "logprobs": True, "top_logprobs": 2})  # fmt: skip
    content = r.json()["choices"][0]["logprobs"]["content"]
    assert content == [{"token": "a", "logprob": -0.5, "bytes": [97], "top_logprobs": [
        {"token": "a", "logprob": -0.5, "bytes": [97]},
        {"token": "b", "logprob": -1.5, "bytes": [98]}]}]  # fmt: skip


def test_completions_prompt_major_indices(client: TestClient) -> None:
    r = client.post("/v1/completions", json={"prompt": ["p", "xy"], "n": 2, "max_tokens": 1})
    body = r.json()
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7,
        "prompt_tokens_details": {"cached_tokens": 0}}  # fmt: skip


def test_completions_default_max_tokens_is_16(client: TestClient, engine: FakeEngine) -> None:
    client.post("/v1/completions", json={"prompt": "p"})
    assert engine.seen_params[-1].max_tokens == 16


def test_echo_scores_prompt_only(client: TestClient) -> None:
    r = client.post("/v1/completions", json={"prompt": "xyz", "echo": True, "max_tokens": 0,
        "logprobs": 1})  # fmt: skip
    choice = r.json()["choices"][0]
    assert choice["text"] == "xyz" and choice["finish_reason"] == "length"
    lp = choice["logprobs"]
    assert lp["tokens"] == ["x", "y", "z"] and lp["text_offset"] == [0, 1, 2]
    assert lp["token_logprobs"] == [None, -0.5, -0.5]
    assert lp["top_logprobs"][0] is None and lp["top_logprobs"][1] == {"y": -0.5}
    assert r.json()["usage"]["completion_tokens"] == 0


def test_echo_stream_and_logprob_offsets(client: TestClient) -> None:
    r = client.post("/v1/completions", json={"prompt": "xy", "echo": True, "max_tokens": 2,
        "logprobs": 0, "stream": True})  # fmt: skip
    chunks = sse(r.text)[:-1]
    assert "".join(c["choices"][0]["text"] for c in chunks) == "xyab"
    offsets = [o for c in chunks for o in c["choices"][0]["logprobs"]["text_offset"]]
    assert offsets == [0, 1, 2, 3]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": [{"role": "user", "content": "x"}], "temperature": -1}, "temperature"),
        ({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, "temperature"),
        ({"messages": [{"role": "user", "content": "x"}], "bogus": 1}, "bogus"),
        (
            {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
            "tools[0].function",
        ),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "user", "content": "x"}], "logit_bias": {"999": 1}}, "logit_bias"),
        ({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "top_logprobs"),
        ({"messages": [{"role": "user", "content": "x"}], "stream_options": {}}, "stream_options"),
    ],
)
def test_chat_bad_fields_name_param(client: TestClient, body: dict, param: str) -> None:
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": []}, "prompt"),
        ({"prompt": [[300]]}, "prompt"),
        ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "x", "suffix": "y"}, "suffix"),
        ({"prompt": "x", "n": 0}, "n"),
    ],
)
def test_completion_bad_fields_name_param(client: TestClient, body: dict, param: str) -> None:
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param


def test_invalid_json_and_non_object(client: TestClient) -> None:
    for content in (b"{not json", b"[1, 2]"):
        r = client.post("/v1/completions", content=content)
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def test_context_length_and_queue_full(client: TestClient, engine: FakeEngine) -> None:
    r = client.post("/v1/completions", json={"prompt": "x" * 60, "max_tokens": 10})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    engine.queue_full = True
    r = client.post("/v1/completions", json={"prompt": "x"})
    assert r.status_code == 429 and r.headers["retry-after"] == "1"


def test_unknown_model_and_route(client: TestClient) -> None:
    r = client.post("/v1/completions", json={"prompt": "x", "model": "gpt-4"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    assert client.get("/v1/models/gpt-4").status_code == 404
    r = client.get("/v1/nothing")
    assert r.status_code == 404 and "error" in r.json()


def test_body_too_large(client: TestClient) -> None:
    r = client.post("/v1/completions", json={"prompt": "x" * 5000})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"


def test_engine_fault_is_500_or_error_frame(client: TestClient, engine: FakeEngine) -> None:
    engine.fail_requests = True
    r = client.post("/v1/completions", json={"prompt": "x"})
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
    r = client.post("/v1/completions", json={"prompt": "x", "stream": True})
    frames = sse(r.text)
    assert r.status_code == 200 and frames[-2]["error"]["type"] == "server_error"


def test_models_tokenize_detokenize_version(client: TestClient) -> None:
    card = client.get("/v1/models").json()["data"][0]
    assert card["id"] == "fake-model" and card["max_model_len"] == 64 and card["object"] == "model"
    assert card["batch_invariant"] is True
    r = client.post("/tokenize", json={"prompt": "hi"}).json()
    assert r == {"count": 2, "max_model_len": 64, "tokens": [104, 105]}
    assert client.post("/detokenize", json={"tokens": [104, 105]}).json() == {"prompt": "hi"}
    assert client.get("/version").json()["version"]
    paths = client.get("/openapi.json").json()["paths"]
    assert "/v1/chat/completions" in paths and "/tokenize" in paths


def test_metrics_names(client: TestClient) -> None:
    client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
    text = client.get("/metrics").text
    for name in ("vllm:num_requests_running", "vllm:kv_cache_usage_perc",
                 'vllm:cache_config_info{block_size="16",model_name="fake-model",num_gpu_blocks="8"}',
                 "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                 'vllm:request_success_total{finished_reason="length",model_name="fake-model"} 1.0',
                 "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
                 "vllm:num_preemptions_total", "vllm:time_to_first_token_seconds_bucket",
                 "vllm:e2e_request_latency_seconds_count", "vllm:request_queue_time_seconds",
                 "vllm:inter_token_latency_seconds"):  # fmt: skip
        assert name in text, name


def test_api_key() -> None:
    app = create_app(ServerConfig(api_key="sekret"), FakeEngine)
    with TestClient(app) as client:
        _wait_ready(client)
        assert client.get("/metrics").status_code == 200
        r = client.get("/v1/models")
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        r = client.get("/v1/models", headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401
        assert (
            client.get("/v1/models", headers={"Authorization": "Bearer sekret"}).status_code == 200
        )


def test_health_is_503_while_loading() -> None:
    release = threading.Event()

    def slow_load() -> FakeEngine:
        release.wait(10)
        return FakeEngine()

    with TestClient(create_app(ServerConfig(), slow_load)) as client:
        r = client.get("/health")
        assert r.status_code == 503
        assert client.post("/v1/completions", json={"prompt": "x"}).status_code == 503
        release.set()
        _wait_ready(client)


def test_no_chat_template_is_400(client: TestClient, engine: FakeEngine) -> None:
    engine.chat_template = None
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 400 and "chat template" in r.json()["error"]["message"]


def test_cors_preflight_passes_before_the_api_key() -> None:
    config = ServerConfig(api_key="k", allowed_origins=("http://ui.example",))
    with TestClient(create_app(config, FakeEngine)) as client:
        _wait_ready(client)
        r = client.options("/v1/chat/completions", headers={
            "Origin": "http://ui.example", "Access-Control-Request-Method": "POST"})  # fmt: skip
        assert r.status_code == 200
        assert r.headers["access-control-allow-origin"] == "http://ui.example"
        r = client.options("/v1/chat/completions", headers={
            "Origin": "http://evil.example", "Access-Control-Request-Method": "POST"})  # fmt: skip
        assert r.status_code == 400
