"""Several models behind one server (issue 39): a real `pagedserve serve --models-dir` process
on loopback and the OpenAI SDK, over two tiny GGUF Llamas, the default model (SmolLM2, slow
enough to load and to stream that what happens meanwhile can be seen) and a broken file."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import psutil
import pytest

from bench.common.server import API_KEY, Server, start_server, stop_server
from bench.common.tiny_models import write_gguf_llama
from pagedserve.core.models.resolve import ResolvedModel

HEADERS = {"Authorization": f"Bearer {API_KEY}"}
IDLE_UNLOAD_S = 5


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, default_model: ResolvedModel
) -> Iterator[Server]:
    models = tmp_path_factory.mktemp("models")
    write_gguf_llama(models / "tiny_a.gguf", seed=1)
    write_gguf_llama(models / "tiny_b.gguf", seed=2)
    (models / "broken.gguf").write_bytes(b"this is not a GGUF file\n" * 8)
    (models / "smol.gguf").symlink_to(default_model.path)
    flags = ["--models-dir", str(models), "--max-loaded-models", "2", "--idle-unload",
             str(IDLE_UNLOAD_S), "--api-key", API_KEY, "--max-model-len", "256", "--num-pages",
             "64", "--cpu-linear", "native"]  # fmt: skip
    srv = start_server(tmp_path_factory.mktemp("server"), *flags)
    yield srv
    code = stop_server(srv)
    assert code == 0, srv.log()


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0)


def _status(client: openai.OpenAI) -> dict[str, str]:
    return {m.id: m.model_dump()["status"]["value"] for m in client.models.list()}


def _wait_for(check: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _complete(client: openai.OpenAI, model: str, max_tokens: int = 4) -> str:
    r = client.completions.create(
        model=model, prompt="hello", max_tokens=max_tokens, extra_body={"ignore_eos": True}
    )
    assert r.model == model and r.usage is not None and r.usage.completion_tokens == max_tokens
    return r.choices[0].text


def _in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = fn()
        except Exception as exc:  # raised again by the test
            out["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def test_every_model_is_listed_and_the_first_request_loads_one(client: openai.OpenAI) -> None:
    assert _status(client) == {m: "unloaded" for m in ("broken", "smol", "tiny_a", "tiny_b")}
    _complete(client, "tiny_a")
    assert _status(client)["tiny_a"] == "loaded"


def test_unknown_and_broken_models_are_clear_errors(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        _complete(client, "no-such-model")
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as broken:
        _complete(client, "broken")
    assert broken.value.code == "model_load_failed" and "GGUF" in broken.value.message
    card = client.models.retrieve("broken").model_dump()
    assert card["status"]["value"] == "failed" and "GGUF" in card["status"]["error"]
    assert _complete(client, "tiny_a")  # the server keeps serving
    assert _status(client)["tiny_a"] == "loaded"


def test_a_model_loads_on_demand_while_another_keeps_answering(
    client: openai.OpenAI, server: Server
) -> None:
    ask = [{"role": "user", "content": "What is the capital of France?"}]
    thread, out = _in_thread(lambda: client.chat.completions.create(
        model="smol", messages=ask, max_tokens=8))  # fmt: skip
    _wait_for(lambda: _status(client)["smol"] == "loading")
    answered_while_loading = 0
    while _status(client)["smol"] == "loading":
        _complete(client, "tiny_a")
        answered_while_loading += _status(client)["smol"] == "loading"
    thread.join(120)
    assert "error" not in out, out
    assert out["result"].model == "smol" and out["result"].choices[0].message.content
    assert answered_while_loading >= 1
    _complete(client, "tiny_a")  # the smol answer may have taken longer than IDLE_UNLOAD_S
    metrics = httpx.get(server.base_url + "/metrics").text
    for model in ("smol", "tiny_a"):
        assert f'vllm:num_requests_running{{model_name="{model}"}}' in metrics
    health = httpx.get(server.base_url + "/health").json()
    assert health["models"]["smol"] == health["models"]["tiny_a"] == "loaded"


def test_eviction_takes_the_idle_model_never_a_stream_in_flight(client: openai.OpenAI) -> None:
    """Two slots, smol streaming (its last use the oldest) and tiny_a idle: tiny_b's load
    evicts tiny_a; smol's stream runs to its end."""
    _complete(client, "tiny_a")
    stream = client.completions.create(
        model="smol", prompt="Once upon a time", max_tokens=128, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    )  # fmt: skip
    chunks = iter(stream)
    first = next(chunks)
    _complete(client, "tiny_a")  # used after smol: smol is the least recently used
    _complete(client, "tiny_b")
    status = _status(client)
    assert status["smol"] == "loaded" and status["tiny_b"] == "loaded", status
    assert status["tiny_a"] == "unloaded"
    rest = list(chunks)
    assert first.model == "smol" and rest[-1].usage is not None
    assert rest[-1].usage.completion_tokens == 128
    assert [c.choices[0].finish_reason for c in rest if c.choices][-1] == "length"


def test_idle_unload_frees_the_model(client: openai.OpenAI, server: Server) -> None:
    _complete(client, "smol")
    process = psutil.Process(server.process.pid)
    loaded_rss = process.memory_info().rss
    _wait_for(lambda: _status(client)["smol"] == "unloaded", IDLE_UNLOAD_S + 30)
    time.sleep(0.5)  # the engine's shutdown, after the status changed
    freed = loaded_rss - process.memory_info().rss
    assert freed > 64 << 20, f"RSS went down by {freed >> 20} MiB only"
    metrics = httpx.get(server.base_url + "/metrics").text
    assert 'vllm:num_requests_running{model_name="smol"}' not in metrics
    assert 'vllm:prompt_tokens_total{model_name="smol"}' in metrics
