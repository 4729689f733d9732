"""/v1/responses over the fake engine: shapes (checked with the OpenAI SDK's own types), the
stream's event sequence, the store (previous_response_id, GET, DELETE, cancel, input_items),
background runs, tools, reasoning and every refusal as OpenAI's error envelope."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter
from starlette.testclient import TestClient

from pagedserve.core.tokenizers.chat_template import ChatTemplate
from pagedserve.openai_compat.responses.store import ResponseStore, StoredResponse
from pagedserve.openai_compat.server_config import ServerConfig
from tests.openai_compat.chat.test_app_tools_reasoning import CALL, QWEN_LIKE
from tests.openai_compat.fake_app import fake_client
from tests.openai_compat.fake_engine import FakeEngine
from tests.openai_compat.test_disconnect_fake import LiveServer, _wait

EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
TOOL = {"type": "function", "name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}  # fmt: skip


@pytest.fixture
def engine() -> FakeEngine:
    engine = FakeEngine()
    engine.model_info = dataclasses.replace(engine.model_info, max_model_len=4096)
    return engine


@pytest.fixture
def client(engine: FakeEngine) -> Iterator[TestClient]:
    yield from fake_client(engine, ServerConfig(response_store_size=4))


def create(client: TestClient, **body: Any) -> dict[str, Any]:
    r = client.post("/v1/responses", json={"input": "hi", "max_output_tokens": 5, **body})
    assert r.status_code == 200, r.text
    Response.model_validate(r.json())
    return r.json()


def events(client: TestClient, **body: Any) -> list[dict[str, Any]]:
    """The stream's events, each checked against the SDK's event types; frames carry `event:`
    and `data:` lines, and sequence numbers count up from 0."""
    r = client.post("/v1/responses", json={"input": "hi", "max_output_tokens": 5,
                                           "stream": True, **body})  # fmt: skip
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    out = []
    for frame in r.text.split("\n\n")[:-1]:
        name, data = frame.split("\n")
        event = orjson.loads(data.removeprefix("data: "))
        assert name == f"event: {event['type']}"
        EVENTS.validate_python(event)
        out.append(event)
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    return out


def error(r: Any, status: int = 400) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def prompt(engine: FakeEngine) -> str:
    return bytes(engine.seen_prompts[-1]).decode()


def test_plain_response_shape(client: TestClient, engine: FakeEngine) -> None:
    body = create(client, instructions="Be brief.", metadata={"k": "v"}, user="u1")
    assert body["id"].startswith("resp_") and body["object"] == "response"
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    [message] = body["output"]
    assert message["id"].startswith("msg_") and message["role"] == "assistant"
    assert message["content"][0]["text"] == "abcde" and message["status"] == "incomplete"
    usage = body["usage"]
    assert usage["output_tokens"] == 5 and usage["input_tokens"] == len(engine.seen_prompts[-1])
    assert usage["total_tokens"] == usage["input_tokens"] + 5
    assert body["metadata"] == {"k": "v"} and body["user"] == "u1"
    assert prompt(engine) == "<system>Be brief.<user>hi<assistant>"
    engine.script = "Done."
    done = create(client, max_output_tokens=50)
    assert done["status"] == "completed" and done["incomplete_details"] is None
    assert done["output"][0]["content"][0]["text"] == "Done."


def test_stream_event_sequence(client: TestClient, engine: FakeEngine) -> None:
    engine.script = "Hi!"
    seq = events(client, max_output_tokens=50)
    kinds = [e["type"] for e in seq]
    assert kinds == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", "response.output_text.delta",
        "response.output_text.delta", "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.completed",
    ]  # fmt: skip
    assert "".join(e["delta"] for e in seq if e["type"] == "response.output_text.delta") == "Hi!"
    final = seq[-1]["response"]
    assert final["status"] == "completed" and final["output"] == [seq[-2]["item"]]
    assert final["usage"]["output_tokens"] == 3
    cut = events(client, max_output_tokens=2)
    assert cut[-1]["type"] == "response.incomplete"
    assert cut[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_previous_response_id_continues_the_conversation(client, engine: FakeEngine) -> None:
    engine.script = "Paris."
    first = create(client, input="Capital of France?", instructions="Old.", max_output_tokens=20)
    engine.script = "Lyon."
    second = create(client, input="And the second city?", previous_response_id=first["id"],
                    instructions="New.", max_output_tokens=20)  # fmt: skip
    assert second["previous_response_id"] == first["id"]
    assert prompt(engine) == (
        "<system>New.<user>Capital of France?<assistant>Paris.<user>And the second city?<assistant>"
    )  # instructions are not carried over
    third = create(client, input="And?", previous_response_id=second["id"], max_output_tokens=20)
    assert "Paris.<user>And the second city?<assistant>Lyon.<user>And?" in prompt(engine)
    assert third["status"] == "completed"
    e = error(client.post("/v1/responses", json={"input": "x", "previous_response_id": "nope"}))
    assert e["param"] == "previous_response_id" and e["code"] == "previous_response_not_found"


def test_retrieve_delete_input_items_and_404s(client: TestClient) -> None:
    body = create(client, input=[{"role": "user", "content": "a"},
                                 {"role": "user", "content": [{"type": "input_text", "text": "b"}]}])  # fmt: skip
    rid = body["id"]
    assert client.get(f"/v1/responses/{rid}").json() == body
    assert error(client.get(f"/v1/responses/{rid}", params={"stream": "true"}))["param"] == "stream"
    items = client.get(f"/v1/responses/{rid}/input_items", params={"order": "asc"}).json()
    assert [i["content"][0]["text"] for i in items["data"]] == ["a", "b"]
    assert all(i["id"].startswith("msg_") for i in items["data"]) and not items["has_more"]
    page = client.get(f"/v1/responses/{rid}/input_items", params={"limit": 1}).json()
    assert page["has_more"] and page["data"][0]["content"][0]["text"] == "b"
    rest = client.get(f"/v1/responses/{rid}/input_items",
                      params={"limit": 1, "after": page["last_id"]}).json()  # fmt: skip
    assert rest["data"][0]["content"][0]["text"] == "a" and not rest["has_more"]
    error(client.get(f"/v1/responses/{rid}/input_items", params={"limit": "0"}))
    error(client.post(f"/v1/responses/{rid}/cancel"))  # neither background nor running
    assert client.delete(f"/v1/responses/{rid}").json() == {
        "id": rid, "object": "response", "deleted": True,
    }  # fmt: skip
    for method, path in [("GET", rid), ("DELETE", rid), ("POST", f"{rid}/cancel"),
                         ("GET", f"{rid}/input_items")]:  # fmt: skip
        e = error(client.request(method, f"/v1/responses/{path}"), 404)
        assert rid in e["message"] and e["type"] == "invalid_request_error"
    unstored = create(client, store=False)
    error(client.get(f"/v1/responses/{unstored['id']}"), 404)


def test_background_run_and_cancel(client: TestClient, engine: FakeEngine) -> None:
    body = create(client, background=True, max_output_tokens=3)
    assert body["status"] == "queued" and body["background"]
    for _ in range(200):
        got = client.get(f"/v1/responses/{body['id']}").json()
        if got["status"] not in ("queued", "in_progress"):
            break
        time.sleep(0.01)
    assert got["status"] == "incomplete" and got["output"][0]["content"][0]["text"] == "abc"
    assert client.post(f"/v1/responses/{body['id']}/cancel").json()["status"] == "incomplete"
    engine.token_delay = 0.05
    slow = create(client, background=True, max_output_tokens=1000)
    time.sleep(0.2)
    cancelled = client.post(f"/v1/responses/{slow['id']}/cancel").json()
    assert cancelled["status"] == "cancelled" and 0 < cancelled["usage"]["output_tokens"] < 100
    Response.model_validate(cancelled)
    assert client.get(f"/v1/responses/{slow['id']}").json()["status"] == "cancelled"
    for _ in range(100):
        if not engine.active:
            break
        time.sleep(0.01)
    assert not engine.active and slow["id"] in engine.aborted  # its pages are freed
    e = error(client.post("/v1/responses", json={"input": "x", "background": True, "store": False}))
    assert e["param"] == "background"


def test_store_is_bounded(client: TestClient) -> None:
    ids = [create(client, max_output_tokens=1)["id"] for _ in range(5)]
    assert client.get(f"/v1/responses/{ids[0]}").status_code == 404  # size 4: the oldest went
    assert all(client.get(f"/v1/responses/{i}").status_code == 200 for i in ids[1:])
    metrics = client.get("/metrics").text
    assert 'pagedserve:responses_stored{model_name="fake-model"} 4.0' in metrics
    assert 'pagedserve:responses_evicted_total{model_name="fake-model"} 1.0' in metrics


def test_store_lru_ttl_and_bytes() -> None:
    clock = [0.0]
    store = ResponseStore(max_entries=2, max_bytes=10_000, ttl_s=10, clock=lambda: clock[0])
    entry = lambda text: StoredResponse({"id": text}, [{"text": text}])  # noqa: E731
    store.put("a", entry("a"))
    store.put("b", entry("b"))
    assert store.get("a") is not None  # now b is the least recently used
    store.put("c", entry("c"))
    assert store.get("b") is None and store.get("a") and store.get("c")
    clock[0] = 11
    assert store.get("a") is None and len(store) == 1  # expired on read
    store.put("d", entry("d"))
    assert store.get("c") is None and len(store) == 1
    store.put("big", StoredResponse({"id": "x" * 20_000}, []))
    assert store.get("big") is None  # larger than the whole store: not kept
    store.update("gone", entry("gone"))
    assert store.get("gone") is None  # update never resurrects
    assert store.delete("d") and not store.delete("d") and store.num_bytes == 0


@pytest.fixture
def qwen(engine: FakeEngine) -> FakeEngine:
    engine.chat_template = ChatTemplate(QWEN_LIKE, bos_token=None, eos_token=None)
    return engine


def test_function_call_round_trip(client: TestClient, qwen: FakeEngine) -> None:
    qwen.script = "Need the weather.</think>\n" + CALL
    body = create(client, input="Weather in Paris?", tools=[TOOL], max_output_tokens=500,
                  reasoning={"summary": "auto"})  # fmt: skip
    reasoning, call = body["output"]
    assert reasoning["type"] == "reasoning" and reasoning["id"].startswith("rs_")
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "Need the weather."}]
    assert reasoning["summary"] == [{"type": "summary_text", "text": "Need the weather."}]
    assert call["type"] == "function_call" and call["id"].startswith("fc_")
    assert call["name"] == "get_weather" and call["arguments"] == '{"city": "Paris"}'
    assert call["call_id"].startswith("call_") and body["status"] == "completed"
    assert body["tools"][0]["name"] == "get_weather" and body["tool_choice"] == "auto"
    assert body["usage"]["output_tokens_details"]["reasoning_tokens"] > 0
    qwen.script = "It is sunny."
    output = {"type": "function_call_output", "call_id": call["call_id"], "output": "21 C"}
    after = create(client, input=[output], previous_response_id=body["id"], tools=[TOOL],
                   max_output_tokens=500)  # fmt: skip
    text = prompt(qwen)
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>' in text
    assert "<|im_start|>tool\n21 C" in text and "Need the weather" not in text
    assert after["output"][-1]["content"][0]["text"] == "It is sunny."
    # The whole history as input, the way clients replay `output` without the store:
    replay = [{"role": "user", "content": "Weather in Paris?"}, *body["output"], output]
    create(client, input=replay, tools=[TOOL], store=False, max_output_tokens=500)
    assert prompt(qwen) == text


def test_streamed_reasoning_and_function_call(client: TestClient, qwen: FakeEngine) -> None:
    qwen.script = "Need the weather.</think>\n" + CALL
    seq = events(client, tools=[TOOL], max_output_tokens=500, reasoning={"summary": "auto"})
    kinds = [e["type"] for e in seq]
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]  # fmt: skip
    assert "response.reasoning_text.delta" in kinds
    assert "response.reasoning_summary_text.done" in kinds
    args = [e["delta"] for e in seq if e["type"] == "response.function_call_arguments.delta"]
    assert "".join(args) == '{"city": "Paris"}'
    done = next(e for e in seq if e["type"] == "response.function_call_arguments.done")
    assert done["arguments"] == '{"city": "Paris"}'
    items = [e["item"] for e in seq if e["type"] == "response.output_item.done"]
    assert [i["type"] for i in items] == ["reasoning", "function_call"]
    assert seq[-1]["type"] == "response.completed" and seq[-1]["response"]["output"] == items
    assert [e["output_index"] for e in seq if e["type"] == "response.output_item.added"] == [0, 1]


def test_tool_choice_and_text_format_reach_the_grammar(client, engine: FakeEngine) -> None:
    create(client, tools=[TOOL], tool_choice={"type": "function", "name": "get_weather"})
    assert engine.compiled[-1].kind == "json_schema"
    allowed = {"type": "allowed_tools", "mode": "required",
               "tools": [{"type": "function", "name": "get_weather"}]}  # fmt: skip
    create(client, tools=[TOOL], tool_choice=allowed)
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    fmt = {"format": {"type": "json_schema", "name": "thing", "schema": schema, "strict": True}}
    body = create(client, text=fmt)
    assert '"a"' in engine.compiled[-1].value and body["text"]["format"]["name"] == "thing"
    create(client, text={"format": {"type": "json_object"}})
    assert engine.compiled[-1].kind == "json_object"
    bad = {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nope"}}}
    e = error(client.post("/v1/responses", json={"input": "x", "text": bad}))
    assert e["param"] == "text.format" and "text.format" in e["message"]


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools", "web_search"),
        ({"tools": [{"type": "web_search_preview"}]}, "tools", "web_search_preview"),
        ({"tools": [{"type": "file_search", "vector_store_ids": ["v"]}]}, "tools", "file_search"),
        ({"tools": [{"type": "computer_use_preview"}]}, "tools", "computer_use_preview"),
        (
            {"tools": [{"type": "code_interpreter", "container": {"type": "auto"}}]},
            "tools",
            "code_interpreter",
        ),
        ({"tools": [{"type": "image_generation"}]}, "tools", "image_generation"),
        ({"tools": [{"type": "mcp", "server_label": "x"}]}, "tools", "mcp"),
        ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice", "web_search_preview"),
        (
            {"tools": [TOOL], "tool_choice": {"type": "function", "name": "other"}},
            "tool_choice",
            "other",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
            "input",
            "input_image",
        ),
        ({"input": [{"type": "web_search_call", "id": "w"}]}, "input[0]", "items are"),
        ({"input": []}, "input", "no message"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input", "no message"),
        ({"input": None}, "input", "required"),
        ({"max_output_tokens": 0}, "max_output_tokens", ""),
        ({"temperature": 3}, "temperature", ""),
        ({"top_logprobs": 2}, "top_logprobs", "not supported"),
        ({"prompt": {"id": "p"}}, "prompt", "not supported"),
        ({"conversation": "c"}, "conversation", "not supported"),
        ({"background": True, "stream": True}, "background", "stream"),
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata", "16"),
        ({"bogus": 1}, "bogus", "Unrecognized"),
        ({"model": "other-model"}, "model", "does not exist"),
        ({"max_output_tokens": 5000}, "input", "do not fit"),
    ],
)
def test_bad_requests_are_4xx_envelopes(client: TestClient, body, param, words) -> None:
    r = client.post("/v1/responses", json={"input": "hi", "max_output_tokens": 5, **body})
    e = error(r, 404 if param == "model" else 400)
    assert e["param"] == param and words in e["message"], e


def test_stream_failure_is_an_error_then_response_failed(client, engine: FakeEngine) -> None:
    engine.fail_requests = True
    seq = events(client)
    assert [e["type"] for e in seq][-2:] == ["error", "response.failed"]
    assert seq[-1]["response"]["status"] == "failed"
    assert seq[-1]["response"]["error"]["code"] == "server_error"
    assert error(client.post("/v1/responses", json={"input": "x"}), 500)["type"] == "server_error"


def test_cancel_before_the_first_token_is_prompt(client: TestClient, engine: FakeEngine) -> None:
    engine.token_delay = 20.0  # the first token would take 20 s (a long queue, a long prefill)
    body = create(client, background=True)
    start = time.monotonic()
    cancelled = client.post(f"/v1/responses/{body['id']}/cancel").json()
    assert time.monotonic() - start < 5 and cancelled["status"] == "cancelled"
    assert cancelled["output"][0]["content"][0]["text"] == ""
    assert body["id"] in engine.aborted and not engine.active


def test_cancel_a_streamed_response(client: TestClient, engine: FakeEngine) -> None:
    engine.token_delay = 0.02
    seen: list[dict[str, Any]] = []

    def read() -> None:
        body = {"input": "hi", "max_output_tokens": 1000, "stream": True}
        with client.stream("POST", "/v1/responses", json=body) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    seen.append(orjson.loads(line[6:]))

    reader = threading.Thread(target=read)
    reader.start()
    while len(seen) < 5:
        time.sleep(0.01)
    rid = seen[0]["response"]["id"]
    assert client.post(f"/v1/responses/{rid}/cancel").json()["status"] == "cancelled"
    reader.join(10)
    assert seen[-1]["type"] == "response.incomplete"
    assert seen[-1]["response"]["status"] == "cancelled" and rid in engine.aborted
    for event in seen:
        EVENTS.validate_python(event)


def test_client_gone_aborts_and_stores_cancelled() -> None:
    """Over a real socket: a client that leaves a stream, or a whole answer before it is
    ready, has its engine request aborted; the stored response says cancelled."""
    engine = FakeEngine(token_delay=0.02)
    engine.model_info = dataclasses.replace(engine.model_info, max_model_len=10_000)
    server = LiveServer(engine)
    try:
        body = {"input": "x", "max_output_tokens": 2000, "stream": True}
        with httpx.stream("POST", server.base + "/v1/responses", json=body, timeout=30) as r:
            lines = r.iter_lines()
            created = orjson.loads(next(line for line in lines if line.startswith("data: "))[6:])
        rid = created["response"]["id"]
        _wait(lambda: not engine.active and rid in engine.aborted)
        stored = httpx.get(f"{server.base}/v1/responses/{rid}").json()
        assert stored["status"] == "cancelled"
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(server.base + "/v1/responses", json={**body, "stream": False}, timeout=0.5)
        _wait(lambda: not engine.active and len(engine.aborted) == 2)
    finally:
        server.stop()
        server.join()


def test_items_become_chat_messages() -> None:
    from pagedserve.openai_compat.responses.input import chat_messages

    call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
    items = [
        {"type": "message", "role": "developer", "content": "Rules."},
        {"role": "user", "content": [{"type": "input_text", "text": "a"},
                                     {"type": "input_text", "text": "b"}]},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "Let me check."}]},
        call,
        {**call, "call_id": "c2"},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "x"}]},
        {"type": "function_call_output", "call_id": "c1", "output": "1"},
        {"type": "function_call_output", "call_id": "c2",
         "output": [{"type": "input_text", "text": "2"}]},
        {**call, "call_id": "c3"},
    ]  # fmt: skip
    messages = chat_messages("Be kind.", items)
    assert [m["role"] for m in messages] == [
        "system", "system", "user", "assistant", "tool", "tool", "assistant",
    ]  # fmt: skip
    assert messages[2]["content"] == "ab" and messages[3]["content"] == "Let me check."
    assert [c["id"] for c in messages[3]["tool_calls"]] == ["c1", "c2"]
    assert messages[5] == {"role": "tool", "tool_call_id": "c2", "content": "2"}
    assert messages[6]["content"] is None and messages[6]["tool_calls"][0]["id"] == "c3"


def test_a_stream_left_before_generation_starts_is_aborted_and_recorded() -> None:
    from pagedserve.openai_compat.common.metrics import ServerMetrics
    from pagedserve.openai_compat.common.serving import ServingContext
    from pagedserve.openai_compat.responses.protocol import ResponsesRequest
    from pagedserve.openai_compat.responses.serving import ResponsesService

    async def main() -> None:
        engine = FakeEngine(token_delay=0.05)
        ctx = ServingContext(engine, "fake-model", ServerMetrics("fake-model", lambda: engine))
        service = ResponsesService(ctx, ResponseStore(10, 1 << 20, 60))
        req = ResponsesRequest.model_validate({"input": "hi", "stream": True})
        run = await service._start(req)
        frames = service._frames(run)
        await frames.__anext__()  # response.created went out, then the client left
        await frames.aclose()  # type: ignore[attr-defined]
        rid = run.response["id"]
        assert run.done.is_set() and not service.running and engine.aborted == [rid]
        stored = service.store.get(rid)
        assert stored is not None and stored.response["status"] == "cancelled"

    asyncio.run(main())


def test_an_embedding_server_refuses_responses(engine: FakeEngine) -> None:
    engine.model_info = dataclasses.replace(engine.model_info, task="embed")
    for client in fake_client(engine):
        e = error(client.post("/v1/responses", json={"input": "hi"}))
        assert "/v1/responses is not available" in e["message"] and e["param"] == "model"
