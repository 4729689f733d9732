"""/v1/messages and /v1/messages/count_tokens against a real server (default model) through the
real clients: the Anthropic SDK (create, the stream helper and text_stream, a tool_use ->
tool_result round trip, count_tokens), LangChain's ChatAnthropic (invoke, stream), httpx for
the raw SSE events; the same greedy text as /v1/chat/completions; and the bad-input matrix, each
answer in Anthropic's error envelope with its status."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import jsonschema
import orjson
import pytest
from anthropic.types import RawMessageStreamEvent
from langchain_anthropic import ChatAnthropic
from pydantic import TypeAdapter

from bench.common.server import API_KEY, Server

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS: Any = [{"name": "get_weather", "description": "Weather in a city", "input_schema": WEATHER}]
ASK: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
EVENTS: TypeAdapter[Any] = TypeAdapter(RawMessageStreamEvent)
HEADERS = {"x-api-key": API_KEY, "anthropic-version": "2023-06-01"}
GREEDY = {"temperature": 0}
"""This SDK's create() no longer names temperature / top_k (Anthropic's newest models refuse
them); the API takes them, and so do older SDKs and raw clients."""


@pytest.fixture(scope="module")
def client(server: Server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key=API_KEY, max_retries=0)


def test_create_plain(client: anthropic.Anthropic, server: Server) -> None:
    out = client.messages.create(
        model=server.model, max_tokens=8, system="You are terse.", extra_body=GREEDY,
        messages=[{"role": "user", "content": "Say hello."}], metadata={"user_id": "u1"},
    )  # fmt: skip
    assert out.id.startswith("msg_") and out.type == "message" and out.role == "assistant"
    assert out.model == server.model and out.content[0].type == "text" and out.content[0].text
    assert out.stop_reason in ("end_turn", "max_tokens") and out.stop_sequence is None
    assert 0 < out.usage.output_tokens <= 8 and out.usage.input_tokens > 0


def test_stream_helper_and_text_stream(client: anthropic.Anthropic, server: Server) -> None:
    kwargs: Any = {"model": server.model, "max_tokens": 12, "extra_body": {**GREEDY, "top_k": 5},
                   "messages": [{"role": "user", "content": "Count to five."}]}  # fmt: skip
    with client.messages.stream(**kwargs) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text and final.content[0].type == "text" and final.content[0].text == text
    assert final.stop_reason in ("end_turn", "max_tokens") and final.usage.output_tokens <= 12
    whole = client.messages.create(**kwargs)
    assert whole.content[0].type == "text" and whole.content[0].text == text


def test_stop_sequences(client: anthropic.Anthropic, server: Server) -> None:
    kwargs: Any = {"model": server.model, "max_tokens": 16, "extra_body": GREEDY,
                   "messages": [{"role": "user", "content": "Count from 1 to 9."}]}  # fmt: skip
    free = client.messages.create(**kwargs)
    assert free.content[0].type == "text"
    text = free.content[0].text
    stop = text[len(text) // 2 :][:2]  # greedy: the same answer stops where this first occurs
    out = client.messages.create(**kwargs, stop_sequences=[stop])
    assert out.stop_reason == "stop_sequence" and out.stop_sequence == stop
    assert "".join(b.text for b in out.content if b.type == "text") == text[: text.index(stop)]


def test_tool_round_trip(client: anthropic.Anthropic, server: Server) -> None:
    first = client.messages.create(
        model=server.model, max_tokens=40, extra_body=GREEDY, messages=ASK, tools=TOOLS,
        tool_choice={"type": "tool", "name": "get_weather"},
    )  # fmt: skip
    [call] = [block for block in first.content if block.type == "tool_use"]
    assert first.stop_reason == "tool_use" and call.name == "get_weather"
    assert call.id.startswith("toolu_")
    jsonschema.validate(call.input, WEATHER)
    result = {"type": "tool_result", "tool_use_id": call.id, "content": "21 C, sunny"}
    history: Any = [*ASK, {"role": "assistant", "content": first.content},
                    {"role": "user", "content": [result]}]  # fmt: skip
    second = client.messages.create(
        model=server.model, max_tokens=8, extra_body=GREEDY, messages=history, tools=TOOLS,
        tool_choice={"type": "none"},
    )  # fmt: skip
    assert second.content[0].type == "text" and second.content[0].text
    assert second.stop_reason in ("end_turn", "max_tokens")
    counted = client.messages.count_tokens(
        model=server.model, messages=history, tools=TOOLS, tool_choice={"type": "none"}
    )
    assert counted.input_tokens == second.usage.input_tokens + (
        second.usage.cache_read_input_tokens or 0
    )


def test_any_tool_streamed_as_input_json(server: Server) -> None:
    body = {"model": server.model, "max_tokens": 40, "temperature": 0, "messages": ASK,
            "tools": TOOLS, "tool_choice": {"type": "any"}, "stream": True}  # fmt: skip
    events = raw_events(server, body)
    starts = [e for e in events if e["type"] == "content_block_start"]
    assert starts[-1]["content_block"]["type"] == "tool_use"
    index = starts[-1]["index"]
    partial = "".join(e["delta"]["partial_json"] for e in events
                      if e["type"] == "content_block_delta" and e["index"] == index)  # fmt: skip
    jsonschema.validate(json.loads(partial), WEATHER)
    assert events[-2]["delta"]["stop_reason"] == "tool_use"


def raw_events(server: Server, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The SSE body as events, each `event:` line checked against its data's type and the
    data against the SDK's event types."""
    r = httpx.post(server.base_url + "/v1/messages", json=body, headers=HEADERS, timeout=120)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = []
    for frame in r.text.removesuffix("\n\n").split("\n\n"):
        name_line, data_line = frame.split("\n")
        event = orjson.loads(data_line.removeprefix("data: "))
        assert name_line == f"event: {event['type']}"
        if event["type"] != "ping":  # the SDK's event union leaves ping out (it skips it)
            EVENTS.validate_python(event)
        events.append(event)
    return events


def test_raw_sse_event_order(server: Server) -> None:
    body = {"model": server.model, "max_tokens": 6, "stream": True,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi!"}]}]}  # fmt: skip
    kinds = [e["type"] for e in raw_events(server, body)]
    assert kinds[:3] == ["message_start", "ping", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[3:-3]) == {"content_block_delta"}


def test_same_greedy_text_as_chat_completions(client: anthropic.Anthropic, server: Server) -> None:
    system, user = "You are a helpful assistant.", "Name three colors."
    out = client.messages.create(
        model=server.model, max_tokens=16, extra_body=GREEDY,
        system=[{"type": "text", "text": system}],
        messages=[{"role": "user", "content": user}],
    )  # fmt: skip
    chat = httpx.post(
        server.base_url + "/v1/chat/completions",
        headers={"Authorization": f"Bearer {API_KEY}"},
        json={"model": server.model, "max_tokens": 16, "temperature": 0,
              "messages": [{"role": "system", "content": system},
                           {"role": "user", "content": user}]},
        timeout=120,
    ).json()  # fmt: skip
    assert out.content[0].type == "text"
    assert out.content[0].text == chat["choices"][0]["message"]["content"]
    assert out.usage.output_tokens == chat["usage"]["completion_tokens"]


def test_langchain_chat_anthropic(server: Server) -> None:
    llm = ChatAnthropic(  # type: ignore[call-arg]
        model=server.model, base_url=server.base_url, api_key=API_KEY, max_tokens=10,
        temperature=0, max_retries=0,
    )  # fmt: skip
    answer = llm.invoke("Say hello.")
    assert isinstance(answer.content, str) and answer.content
    chunks = list(llm.stream("Say hello."))
    streamed = "".join(c.content for c in chunks if isinstance(c.content, str))
    streamed += "".join(
        part.get("text", "") for c in chunks if isinstance(c.content, list)
        for part in c.content if isinstance(part, dict)
    )  # fmt: skip
    assert streamed == answer.content


GOOD: dict[str, Any] = {"max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}
IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}}
BAD_BODIES: list[tuple[str, dict[str, Any], str]] = [
    ("missing max_tokens", {"messages": GOOD["messages"]}, "max_tokens"),
    ("bad role", {**GOOD, "messages": [{"role": "system", "content": "Hi"}]}, "role"),
    ("empty messages", {**GOOD, "messages": []}, "messages"),
    ("max_tokens a string", {**GOOD, "max_tokens": "4"}, "max_tokens"),
    ("content a number", {**GOOD, "messages": [{"role": "user", "content": 5}]}, "content"),
    ("image on a text model", {**GOOD, "messages": [{"role": "user", "content": [IMAGE]}]},
     "messages[0].content[0]: This model does not take images"),
    ("image file source", {**GOOD, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "file", "file_id": "file_1"}}]}]}, "file image sources"),
    ("image in tool_result", {**GOOD, "messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t1", "content": [IMAGE]}]}]}, "inside tool_result"),
    ("image from the assistant", {**GOOD, "messages": [
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": [IMAGE]},
        {"role": "user", "content": "Hi"}]}, "image blocks belong in user messages"),
    ("temperature above 1", {**GOOD, "temperature": 1.5}, "temperature"),
    ("unknown field", {**GOOD, "frequency_penalty": 1}, "frequency_penalty"),
    ("tool_choice without tools", {**GOOD, "tool_choice": {"type": "any"}}, "tool_choice"),
    ("prefill", {**GOOD, "messages": [*GOOD["messages"],
                                      {"role": "assistant", "content": "A"}]}, "prefill"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "body", "word"), BAD_BODIES, ids=[b[0] for b in BAD_BODIES])
def test_bad_input_is_a_400_envelope(server: Server, name: str, body: dict, word: str) -> None:
    r = httpx.post(server.base_url + "/v1/messages", json={"model": server.model, **body},
                   headers=HEADERS, timeout=30)  # fmt: skip
    assert_envelope(r, 400, "invalid_request_error", word)


def assert_envelope(r: httpx.Response, status: int, kind: str, word: str) -> None:
    body = r.json()
    assert r.status_code == status, body
    assert set(body) == {"type", "error"} and body["type"] == "error", body
    assert body["error"]["type"] == kind and word in body["error"]["message"], body


def test_other_errors_in_anthropic_envelope(server: Server) -> None:
    url = server.base_url + "/v1/messages"
    r = httpx.post(url, json={**GOOD, "model": "claude-nope"}, headers=HEADERS, timeout=30)
    assert_envelope(r, 404, "not_found_error", "claude-nope")
    r = httpx.post(url, json={**GOOD, "model": server.model}, headers={"x-api-key": "wrong"})
    assert_envelope(r, 401, "authentication_error", "API key")
    r = httpx.post(url, content=b"{not json", headers=HEADERS, timeout=30)
    assert_envelope(r, 400, "invalid_request_error", "JSON")
    r = httpx.post(url + "/count_tokens", json={"model": server.model, "messages": []},
                   headers=HEADERS, timeout=30)  # fmt: skip
    assert_envelope(r, 400, "invalid_request_error", "messages")
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(
            base_url=server.base_url, api_key="wrong", max_retries=0
        ).messages.create(model=server.model, **GOOD)
    # Bearer auth (the OpenAI side's) is accepted here too.
    r = httpx.post(url, json={**GOOD, "model": server.model},
                   headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60)  # fmt: skip
    assert r.status_code == 200 and r.json()["type"] == "message"
