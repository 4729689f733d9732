"""/v1/responses against a real server (default model) through the real clients: the OpenAI
SDK (create, both ways of streaming, a function tool round trip, text.format json_schema,
previous_response_id with the prefix cache, retrieve / delete / cancel and their 404s), the
OpenAI Agents SDK and LangChain's ChatOpenAI(use_responses_api=True). Every raw stream event is
validated against the SDK's pydantic event types."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from typing import Any

import httpx
import jsonschema
import openai
import orjson
import pytest
from openai.types.responses import ResponseStreamEvent
from pydantic import BaseModel, Field, TypeAdapter

from bench.common.server import API_KEY, Server

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [{"type": "function", "name": "get_weather", "description": "Weather in a city",
                     "parameters": WEATHER, "strict": True}]  # fmt: skip
NAMED: Any = {"type": "function", "name": "get_weather"}
YES_NO = {"type": "object", "properties": {"yes": {"type": "boolean"}}, "required": ["yes"],
          "additionalProperties": False}  # fmt: skip
EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0)


def test_create_plain(client: openai.OpenAI, server: Server) -> None:
    out = client.responses.create(
        model=server.model, input="Say hello.", instructions="You are terse.",
        max_output_tokens=8, temperature=0,
    )  # fmt: skip
    assert out.id.startswith("resp_") and out.object == "response" and out.output_text
    assert out.status in ("completed", "incomplete") and out.model == server.model
    assert out.usage is not None and 0 < out.usage.output_tokens <= 8
    assert out.usage.total_tokens == out.usage.input_tokens + out.usage.output_tokens
    if out.status == "incomplete":
        assert out.incomplete_details is not None
        assert out.incomplete_details.reason == "max_output_tokens"


def test_stream_helper_and_raw_events(client: openai.OpenAI, server: Server) -> None:
    # The helper needs response.completed (an incomplete one ends with response.incomplete):
    # a one-boolean schema makes the answer end after a few tokens.
    with client.responses.stream(
        model=server.model, input="Is the sky blue?", max_output_tokens=30, temperature=0,
        text={"format": {"type": "json_schema", "name": "yes_no", "schema": YES_NO}},
    ) as stream:  # fmt: skip
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert deltas and "".join(deltas) == final.output_text
    raw = client.responses.create(
        model=server.model, input="Count to five.", max_output_tokens=6, temperature=0,
        stream=True,
    )  # fmt: skip
    seen = [event.type for event in raw]
    assert seen[0] == "response.created" and seen[-1] in ("response.completed",
                                                          "response.incomplete")  # fmt: skip
    body = {"model": server.model, "input": "Count to five.", "max_output_tokens": 6,
            "stream": True}  # fmt: skip
    headers = {"Authorization": f"Bearer {API_KEY}"}
    r = httpx.post(server.base_url + "/v1/responses", json=body, headers=headers, timeout=120)
    events = [orjson.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    for event in events:
        EVENTS.validate_python(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))


def test_function_tool_round_trip(client: openai.OpenAI, server: Server) -> None:
    first = client.responses.create(
        model=server.model, input="What is the weather in Paris?", tools=TOOLS,
        tool_choice=NAMED, max_output_tokens=40, temperature=0,
    )  # fmt: skip
    [call] = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather" and call.id and call.id.startswith("fc_")
    jsonschema.validate(json.loads(call.arguments), WEATHER)
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "21 C, sunny"}
    second = client.responses.create(
        model=server.model, input=[result], previous_response_id=first.id, tools=TOOLS,
        tool_choice="none", max_output_tokens=8, temperature=0,
    )  # fmt: skip
    assert second.output_text and second.previous_response_id == first.id
    # The same turn without the store: the earlier output replayed as input.
    replay = [{"role": "user", "content": "What is the weather in Paris?"}, *first.output, result]
    third = client.responses.create(
        model=server.model, input=replay, tools=TOOLS, tool_choice="none", store=False,
        max_output_tokens=8, temperature=0,
    )  # fmt: skip
    assert third.output_text == second.output_text
    assert third.usage and second.usage and third.usage.input_tokens == second.usage.input_tokens


def test_text_format_json_schema(client: openai.OpenAI, server: Server) -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
              "age": {"type": "integer", "minimum": 0, "maximum": 120}},
              "required": ["name", "age"], "additionalProperties": False}  # fmt: skip
    out = client.responses.create(
        model=server.model, input="Describe a person as JSON.", max_output_tokens=60,
        temperature=0, text={"format": {"type": "json_schema", "name": "person",
                                        "schema": schema, "strict": True}},
    )  # fmt: skip
    assert out.status == "completed", out
    jsonschema.validate(json.loads(out.output_text), schema)

    class Person(BaseModel):
        name: str = Field(max_length=12)
        age: int = Field(ge=0, le=120)

    parsed = client.responses.parse(
        model=server.model, input="Describe a person.", text_format=Person,
        max_output_tokens=60, temperature=0,
    )  # fmt: skip
    assert isinstance(parsed.output_parsed, Person)


def test_previous_response_id_hits_the_prefix_cache(client: openai.OpenAI, server) -> None:
    first = client.responses.create(
        model=server.model, input="Name a fruit. " * 20, max_output_tokens=6, temperature=0
    )
    second = client.responses.create(
        model=server.model, input="Name another.", previous_response_id=first.id,
        max_output_tokens=6, temperature=0,
    )  # fmt: skip
    assert second.usage and first.usage
    assert second.usage.input_tokens > first.usage.input_tokens
    assert second.usage.input_tokens_details.cached_tokens >= 16  # at least a page reused


def test_retrieve_delete_cancel_and_404s(client: openai.OpenAI, server: Server) -> None:
    out = client.responses.create(model=server.model, input="Hi", max_output_tokens=4)
    assert client.responses.retrieve(out.id).output_text == out.output_text
    items = client.responses.input_items.list(out.id)
    assert [i.type for i in items.data] == ["message"]
    client.responses.delete(out.id)
    for call in (client.responses.retrieve, client.responses.delete, client.responses.cancel):
        with pytest.raises(openai.NotFoundError):
            call(out.id)
    background = client.responses.create(
        model=server.model, input="Write a long story.", max_output_tokens=200, background=True
    )
    assert background.status == "queued"
    cancelled = client.responses.cancel(background.id)
    assert cancelled.status in ("cancelled", "completed", "incomplete")
    assert client.responses.retrieve(background.id).status == cancelled.status
    with pytest.raises(openai.BadRequestError, match="web_search"):
        client.responses.create(model=server.model, input="x", tools=[{"type": "web_search"}])


def test_openai_agents_sdk_with_a_function_tool(server: Server) -> None:
    from agents import Agent, ModelSettings, Runner, function_tool, set_tracing_disabled
    from agents.models.openai_responses import OpenAIResponsesModel

    set_tracing_disabled(True)
    calls: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        calls.append(city)
        return f"21 C and sunny in {city}"

    aclient = openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0)
    agent = Agent(
        name="weather",
        instructions="Answer with the weather tool.",
        tools=[get_weather],
        model=OpenAIResponsesModel(model=server.model, openai_client=aclient),
        model_settings=ModelSettings(tool_choice="get_weather", max_tokens=40, temperature=0),
        tool_use_behavior="stop_on_first_tool",
    )

    class Answer(BaseModel):  # structured output: the answer ends after a few tokens
        yes: bool

    plain = Agent(name="plain", instructions="Answer in JSON.", output_type=Answer,
                  model=OpenAIResponsesModel(model=server.model, openai_client=aclient),
                  model_settings=ModelSettings(max_tokens=30, temperature=0))  # fmt: skip

    async def run_all() -> tuple[Any, Any, list[str]]:  # one loop: the client's connections
        streamed = Runner.run_streamed(plain, "Is the sky blue?", max_turns=1)
        kinds = [event.type async for event in streamed.stream_events()]
        return (
            await Runner.run(agent, "What is the weather in Paris?", max_turns=3),
            streamed,
            kinds,
        )

    result, streamed, kinds = asyncio.run(run_all())
    assert len(calls) == 1 and result.final_output == f"21 C and sunny in {calls[0]}"
    assert isinstance(streamed.final_output, Answer) and "raw_response_event" in kinds


def test_langchain_use_responses_api_with_bind_tools(server: Server) -> None:
    from langchain_core.messages import ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return "21 C"

    llm = ChatOpenAI(
        model=server.model, base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0,
        use_responses_api=True, max_tokens=30, temperature=0,
    )  # fmt: skip
    assert llm.invoke("Say hello.").text
    bound = llm.bind_tools([get_weather], tool_choice="get_weather")
    ask = [("user", "What is the weather in Paris?")]
    message = bound.invoke(ask)
    [call] = message.tool_calls
    assert call["name"] == "get_weather" and isinstance(call["args"]["city"], str)
    chunks = list(bound.stream(ask))
    assert chunks
    history = [*ask, message, ToolMessage("21 C", tool_call_id=call["id"])]
    after = llm.bind_tools([get_weather], tool_choice="none").invoke(history)
    assert after.text


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_curl_streaming(server: Server) -> None:
    body = {"model": server.model, "input": "Hi", "max_output_tokens": 4, "stream": True}
    out = subprocess.run(
        ["curl", "-sS", "-N", server.base_url + "/v1/responses",
         "-H", "Content-Type: application/json", "-H", f"Authorization: Bearer {API_KEY}",
         "-d", orjson.dumps(body).decode()],
        capture_output=True, timeout=120, check=True,
    ).stdout.decode()  # fmt: skip
    frames = [f.split("\n") for f in out.split("\n\n") if f]
    assert all(len(f) == 2 and f[0].startswith("event: ") for f in frames), out[:500]
    events = [orjson.loads(f[1].removeprefix("data: ")) for f in frames]
    assert [f[0][7:] for f in frames] == [e["type"] for e in events]
    assert events[0]["type"] == "response.created"
    assert events[-1]["type"] in ("response.completed", "response.incomplete")
