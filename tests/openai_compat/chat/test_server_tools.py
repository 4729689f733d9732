"""Tools through the real OpenAI SDK and LangChain against a real server (default model, whose
template has no tool section: required / named calls are grammar-constrained; auto uses the
fallback prompt and the hermes parser)."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field

from bench.common.server import API_KEY, Server

WEATHER_PARAMS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                      "parameters": WEATHER_PARAMS}},
    {"type": "function", "function": {"name": "get_time", "description": "Current time",
                                      "parameters": {"type": "object", "properties": {}}}},
]  # fmt: skip
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
LIMITS = {"max_tokens": 60, "temperature": 0}


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0)


def check_call(call, names: set[str]) -> None:
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name in names
    args = json.loads(call.function.arguments)
    if call.function.name == "get_weather":
        jsonschema.validate(args, WEATHER_PARAMS)


def test_required_gives_valid_calls_for_every_choice(client: openai.OpenAI, server) -> None:
    out = client.chat.completions.create(
        model=server.model, messages=ASK, tools=TOOLS, tool_choice="required", n=2,
        parallel_tool_calls=False, **LIMITS,
    )  # fmt: skip
    for choice in out.choices:
        assert choice.finish_reason == "tool_calls"
        assert len(choice.message.tool_calls) == 1 and choice.message.content is None
        check_call(choice.message.tool_calls[0], {"get_weather", "get_time"})


def test_named_function(client: openai.OpenAI, server: Server) -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    out = client.chat.completions.create(
        model=server.model, messages=ASK, tools=TOOLS, tool_choice=named, **LIMITS
    )
    [call] = out.choices[0].message.tool_calls
    check_call(call, {"get_weather"})
    assert out.choices[0].finish_reason == "tool_calls"


def test_none_answers_in_text(client: openai.OpenAI, server: Server) -> None:
    out = client.chat.completions.create(
        model=server.model, messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=8
    )
    assert out.choices[0].message.tool_calls is None and out.choices[0].message.content


def test_auto_on_a_template_without_tools_completes(client: openai.OpenAI, server) -> None:
    out = client.chat.completions.create(model=server.model, messages=ASK, tools=TOOLS, **LIMITS)
    message = out.choices[0].message
    assert message.content or message.tool_calls
    for call in message.tool_calls or []:
        json.loads(call.function.arguments)


def test_streamed_tool_call_deltas_assemble(client: openai.OpenAI, server: Server) -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    with client.chat.completions.stream(
        model=server.model, messages=ASK, tools=TOOLS, tool_choice=named, **LIMITS
    ) as stream:
        events = [e.type for e in stream]
        final = stream.get_final_completion()
    assert "tool_calls.function.arguments.delta" in events
    [call] = final.choices[0].message.tool_calls
    check_call(call, {"get_weather"})
    raw = client.chat.completions.create(
        model=server.model, messages=ASK, tools=TOOLS, tool_choice="required", stream=True,
        parallel_tool_calls=False, **LIMITS,
    )  # fmt: skip
    deltas = [
        c.choices[0].delta.tool_calls for c in raw if c.choices and c.choices[0].delta.tool_calls
    ]
    first = deltas[0][0]
    assert first.index == 0 and first.id and first.function.name and first.type == "function"
    assert len(deltas) > 2 and all(d[0].id is None for d in deltas[1:])
    json.loads("".join(d[0].function.arguments or "" for d in deltas))


def test_tool_result_round_trip(client: openai.OpenAI, server: Server) -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    first = client.chat.completions.create(
        model=server.model, messages=ASK, tools=TOOLS, tool_choice=named, **LIMITS
    )
    call = first.choices[0].message.tool_calls[0]
    history = [
        *ASK,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21}'},
    ]
    answer = client.chat.completions.create(
        model=server.model, messages=history, tools=TOOLS, tool_choice="none", max_tokens=16
    )
    assert answer.choices[0].message.content


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters":
          {"type": "object", "properties": {"a": {"type": "wrong"}}}}}]}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]},
         "tools[0].function.name"),
        ({"tools": TOOLS + TOOLS[:1]}, "tools"),
        ({"tool_choice": "required", "tools": None}, "tool_choice"),
        ({"tool_choice": "required", "response_format": {"type": "json_object"}},
         "response_format"),
    ],
)  # fmt: skip
def test_bad_tool_requests_are_400(client: openai.OpenAI, server, extra: dict, param) -> None:
    body = {"tools": TOOLS, **extra}
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(
            model=server.model, messages=ASK, max_tokens=4, extra_body=body
        )
    assert bad.value.body["param"] == param, bad.value.body


# ---- LangChain ------------------------------------------------------------------------------


@tool
def get_weather(city: str, unit: str) -> str:
    """Weather in a city (unit: celsius or fahrenheit)."""
    return f"21 degrees {unit} in {city}"


class Answer(BaseModel):
    """A short answer."""

    answer: str = Field(max_length=20)
    confident: bool


@pytest.fixture(scope="module")
def chat(server: Server) -> ChatOpenAI:
    return ChatOpenAI(model=server.model, base_url=server.base_url + "/v1", api_key=API_KEY,
                      max_tokens=60, temperature=0, max_retries=0)  # fmt: skip


@pytest.mark.parametrize("tool_choice", ["get_weather", "any"])
def test_langchain_bind_tools(chat: ChatOpenAI, tool_choice: str) -> None:
    bound = chat.bind_tools([get_weather], tool_choice=tool_choice, parallel_tool_calls=False)
    message = bound.invoke("What is the weather in Paris?")
    assert isinstance(message, AIMessage)
    [call] = message.tool_calls
    assert call["name"] == "get_weather" and set(call["args"]) == {"city", "unit"}
    result = get_weather.invoke(call)
    assert isinstance(result, ToolMessage)
    reply = chat.bind(max_tokens=8).invoke(
        [HumanMessage("What is the weather in Paris?"), message, result]
    )
    assert isinstance(reply.content, str)


def test_langchain_streamed_tool_calls(chat: ChatOpenAI) -> None:
    bound = chat.bind_tools([get_weather], tool_choice="get_weather")
    chunks = list(bound.stream("Weather in Oslo?"))
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged = merged + chunk
    [call] = merged.tool_calls
    assert call["name"] == "get_weather" and set(call["args"]) == {"city", "unit"}


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_langchain_with_structured_output(chat: ChatOpenAI, method: str) -> None:
    structured = chat.with_structured_output(Answer, method=method)
    result = structured.invoke("Is the sky blue? Answer briefly.")
    assert isinstance(result, Answer)
