"""Tools and reasoning in the HTTP layer over the fake engine with scripted outputs: a Qwen-like
template (tools and <think>), chat_template_kwargs, the hermes parser whole and streamed, and
the fallback prompt for a template without a tool section."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Iterator

import pytest
from starlette.testclient import TestClient

from pagedserve.core.tokenizers.chat_template import ChatTemplate
from pagedserve.openai_compat.app import create_app
from pagedserve.openai_compat.server_config import ServerConfig
from tests.openai_compat.fake_engine import FakeEngine
from tests.openai_compat.test_app_fake import _wait_ready, sse

QWEN_LIKE = """{%- if tools %}<|im_start|>system
<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>
Call tools as <tool_call>{"name": ..., "arguments": ...}</tool_call><|im_end|>
{% endif %}{%- for m in messages %}<|im_start|>{{ m.role }}
{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{{ c.function | tojson }}</tool_call>\
{% endfor %}{% else %}{{ m.content }}{% endif %}<|im_end|>
{% endfor %}{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and enable_thinking is false %}<think>

</think>

{% else %}<think>
{% endif %}{% endif %}"""
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]  # fmt: skip
ASK = [{"role": "user", "content": "Weather in Paris?"}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.fixture
def engine() -> FakeEngine:
    engine = FakeEngine()
    engine.model_info = dataclasses.replace(engine.model_info, max_model_len=4096)
    engine.chat_template = ChatTemplate(QWEN_LIKE, bos_token=None, eos_token=None)
    return engine


@pytest.fixture
def client(engine: FakeEngine) -> Iterator[TestClient]:
    app = create_app(ServerConfig(), lambda: engine)
    with TestClient(app) as client:
        _wait_ready(client)
        yield client


def prompt_text(engine: FakeEngine) -> str:
    return bytes(engine.seen_prompts[-1]).decode()


def chat(client: TestClient, **body: object) -> dict:
    r = client.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 500, **body})
    assert r.status_code == 200, r.text
    return r.json()


def streamed(client: TestClient, **body: object) -> list[dict]:
    r = client.post(
        "/v1/chat/completions", json={"messages": ASK, "max_tokens": 500, "stream": True, **body}
    )
    assert r.status_code == 200, r.text
    return [c for c in sse(r.text) if isinstance(c, dict)]


def test_thinking_goes_to_reasoning_content(client: TestClient, engine: FakeEngine) -> None:
    engine.script = "I should add.</think>\n\nThe answer is 4."
    message = chat(client)["choices"][0]["message"]
    assert prompt_text(engine).endswith("<think>\n")
    assert (
        message["reasoning_content"] == "I should add." and message["content"] == "The answer is 4."
    )
    chunks = streamed(client)
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "I should add."
    assert "".join(d.get("content", "") for d in deltas) == "The answer is 4."


def test_chat_template_kwargs_reach_the_template(client: TestClient, engine) -> None:
    engine.script = "Plain answer."
    message = chat(client, chat_template_kwargs={"enable_thinking": False})["choices"][0]["message"]
    assert prompt_text(engine).endswith("</think>\n\n")
    assert message["content"] == "Plain answer." and message["reasoning_content"] is None


def test_auto_tool_call_after_thinking(client: TestClient, engine: FakeEngine) -> None:
    engine.script = "Need the weather.</think>\n" + CALL
    choice = chat(client, tools=TOOLS)["choices"][0]
    assert '"name": "get_weather"' in prompt_text(engine)  # the template got the tools
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["reasoning_content"] == "Need the weather." and message["content"] is None
    [call] = message["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    chunks = streamed(client, tools=TOOLS)
    calls = [
        tc for c in chunks if c["choices"] for tc in c["choices"][0]["delta"].get("tool_calls", [])
    ]
    assert calls[0]["id"].startswith("call_") and calls[0]["function"]["name"] == "get_weather"
    assert "".join(tc["function"]["arguments"] for tc in calls) == '{"city": "Paris"}'
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "tool_calls"


def test_tool_history_renders_arguments_as_objects(client: TestClient, engine) -> None:
    engine.script = "Sunny."
    history = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "21 C"},
    ]  # fmt: skip
    chat(client, messages=history, tools=TOOLS)
    text = prompt_text(engine)
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>' in text
    assert "<|im_start|>tool\n21 C" in text


def test_fallback_prompt_for_a_template_without_tools(engine: FakeEngine) -> None:
    engine.chat_template = FakeEngine().chat_template  # TagTemplate: no tool section
    engine.script = CALL
    with TestClient(create_app(ServerConfig(), lambda: engine)) as client:
        _wait_ready(client)
        history = [
            *ASK,
            {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "21 C"},
        ]  # fmt: skip
        choice = chat(client, messages=history, tools=TOOLS)["choices"][0]
    text = prompt_text(engine)
    assert text.startswith("<system>You can call these tools") and '"name": "get_weather"' in text
    assert '<assistant><tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}' in text
    assert "<user><tool_response>\n21 C\n</tool_response>" in text
    assert json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"]) == {
        "city": "Paris"
    }


def test_parallel_tool_calls_false_keeps_the_first_call(client: TestClient, engine) -> None:
    engine.script = CALL + "\n" + CALL.replace("Paris", "Oslo")
    quiet = {"enable_thinking": False}
    both = chat(client, tools=TOOLS, chat_template_kwargs=quiet)["choices"][0]["message"][
        "tool_calls"
    ]
    assert [json.loads(c["function"]["arguments"])["city"] for c in both] == ["Paris", "Oslo"]
    one = chat(client, tools=TOOLS, parallel_tool_calls=False, chat_template_kwargs=quiet)
    one = one["choices"][0]["message"]
    assert [json.loads(c["function"]["arguments"])["city"] for c in one["tool_calls"]] == ["Paris"]


def test_a_compiling_grammar_never_stalls_other_streams(client: TestClient, engine) -> None:
    """The compile of request A is held on its worker thread until request B has streamed to
    the end: were it compiled on the event loop, B could never finish (and this would hang)."""
    engine.compile_gate = threading.Event()
    statuses: list[int] = []
    body = {"messages": ASK, "max_tokens": 3, "response_format": {"type": "json_object"}}
    slow = threading.Thread(
        target=lambda: statuses.append(client.post("/v1/chat/completions", json=body).status_code)
    )
    slow.start()
    while not engine.compiled:
        threading.Event().wait(0.01)
    engine.script = "Other stream."
    assert (
        "".join(
            c["choices"][0]["delta"].get("content", "")
            for c in streamed(client, chat_template_kwargs={"enable_thinking": False})
            if c["choices"]
        )
        == "Other stream."
    )
    assert not statuses  # A is still compiling
    engine.compile_gate.set()
    slow.join(30)
    assert statuses == [200]
