"""/v1/messages over the fake engine with scripted outputs: thinking blocks from the reasoning
parser and tool_use blocks from the hermes parser (whole and streamed, which agree), a full
queue as 529 overloaded_error, the engine loading as 503, and a client that leaves mid-stream
or before a whole answer has its engine request aborted."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from starlette.testclient import TestClient

from pagedserve.core.tokenizers.chat_template import ChatTemplate
from pagedserve.openai_compat.app import create_app
from pagedserve.openai_compat.server_config import ServerConfig
from tests.openai_compat.chat.test_app_tools_reasoning import CALL, QWEN_LIKE
from tests.openai_compat.fake_engine import FakeEngine
from tests.openai_compat.test_app_fake import _wait_ready
from tests.openai_compat.test_disconnect_fake import _wait, live  # noqa: F401 (a fixture)

TOOLS = [{"name": "get_weather", "input_schema": {"type": "object", "properties": {
    "city": {"type": "string"}}}}]  # fmt: skip
ASK = {"model": "fake-model", "max_tokens": 200,
       "messages": [{"role": "user", "content": "Weather in Paris?"}]}  # fmt: skip


@pytest.fixture
def engine() -> FakeEngine:
    engine = FakeEngine()
    engine.model_info = dataclasses.replace(engine.model_info, max_model_len=4096)
    engine.chat_template = ChatTemplate(QWEN_LIKE, bos_token=None, eos_token=None)
    return engine


@pytest.fixture
def client(engine: FakeEngine) -> Iterator[TestClient]:
    with TestClient(create_app(ServerConfig(), lambda: engine)) as client:
        _wait_ready(client)
        yield client


def events(client: TestClient, body: dict[str, Any]) -> list[dict[str, Any]]:
    r = client.post("/v1/messages", json={**body, "stream": True})
    assert r.status_code == 200, r.text
    frames = r.text.removesuffix("\n\n").split("\n\n")
    return [orjson.loads(frame.split("\n")[1].removeprefix("data: ")) for frame in frames]


def blocks_of(stream: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The blocks a client rebuilds from the events (as the SDK's accumulator does)."""
    blocks: list[dict[str, Any]] = []
    for e in stream:
        if e["type"] == "content_block_start":
            blocks.append({**e["content_block"], "partial": ""})
        elif e["type"] == "content_block_delta":
            delta, block = e["delta"], blocks[e["index"]]
            key = {"text_delta": "text", "thinking_delta": "thinking"}.get(delta["type"])
            if key:
                block[key] += delta[key]
            else:
                block["partial"] += delta["partial_json"]
    for block in blocks:
        partial = block.pop("partial")
        if block["type"] == "tool_use":
            block["input"] = orjson.loads(partial)
    return blocks


def test_thinking_then_tool_use_whole_and_streamed(engine: FakeEngine, client) -> None:
    engine.script = "I should call it.</think>\n\n" + CALL
    whole = client.post("/v1/messages", json={**ASK, "tools": TOOLS}).json()
    assert [b["type"] for b in whole["content"]] == ["thinking", "tool_use"]
    assert whole["content"][0]["thinking"] == "I should call it."
    call = whole["content"][1]
    assert call["name"] == "get_weather" and call["input"] == {"city": "Paris"}
    assert whole["stop_reason"] == "tool_use" and call["id"].startswith("toolu_")
    stream = events(client, {**ASK, "tools": TOOLS})
    streamed = blocks_of(stream)
    assert [{**b, "id": None} for b in streamed] == [{**b, "id": None} for b in whole["content"]]
    assert stream[-2]["delta"]["stop_reason"] == "tool_use"


def test_thinking_disabled_reaches_the_template(engine: FakeEngine, client) -> None:
    engine.script = "Hello."
    body = {**ASK, "thinking": {"type": "disabled"}}
    out = client.post("/v1/messages", json=body).json()
    assert bytes(engine.seen_prompts[-1]).decode().endswith("<think>\n\n</think>\n\n")
    assert out["content"] == [{"type": "text", "text": "Hello."}]
    assert out["stop_reason"] == "end_turn"


def test_assistant_history_and_tool_results_render(engine: FakeEngine, client) -> None:
    engine.script = "Sunny."
    history = [
        ASK["messages"][0],
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "hidden", "signature": ""},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
             "input": {"city": "Paris"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "21 C"},
            {"type": "text", "text": "And tomorrow?"}]},
    ]  # fmt: skip
    out = client.post("/v1/messages", json={**ASK, "messages": history, "tools": TOOLS})
    assert out.status_code == 200, out.text
    prompt = bytes(engine.seen_prompts[-1]).decode()
    assert '"city": "Paris"' in prompt and "21 C" in prompt and "And tomorrow?" in prompt
    assert "hidden" not in prompt


def test_full_queue_is_529_and_loading_503(engine: FakeEngine, client) -> None:
    engine.queue_full = True
    r = client.post("/v1/messages", json=ASK)
    assert r.status_code == 529 and r.headers["retry-after"] == "1"
    assert r.json()["error"]["type"] == "overloaded_error"
    engine.errored = True
    r = client.post("/v1/messages/count_tokens", json=ASK)
    assert r.status_code == 503 and r.json()["error"]["type"] == "api_error"


def test_disconnect_aborts(request: pytest.FixtureRequest) -> None:
    base, engine = request.getfixturevalue("live")  # test_disconnect_fake's live server
    body = {**ASK, "max_tokens": 2000, "stream": True}
    with httpx.stream("POST", base + "/v1/messages", json=body, timeout=30) as response:
        lines = response.iter_lines()
        assert next(lines) == "event: message_start"
        _wait(lambda: len(engine.active) == 1)
    _wait(lambda: not engine.active)
    assert len(engine.aborted) == 1
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(base + "/v1/messages", json={**ASK, "max_tokens": 2000}, timeout=0.5)
    _wait(lambda: not engine.active and len(engine.aborted) == 2)
