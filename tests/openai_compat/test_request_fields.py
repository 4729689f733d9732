"""Request fields that change what comes back: `stream_options.continuous_usage_stats` (usage on
every chunk, as vLLM does) and `messages[].name` (handed to the chat template, as transformers
does), over the fake engine."""

from __future__ import annotations

from collections.abc import Iterator

import orjson
import pytest
from starlette.testclient import TestClient

from pagedserve.core.tokenizers.chat_template import ChatTemplate
from tests.openai_compat.fake_app import fake_client
from tests.openai_compat.fake_engine import FakeEngine

NAMED_TEMPLATE = (
    "{% for m in messages %}[{{ m.role }}{% if m.name is defined %} {{ m.name }}{% endif %}]"
    "{{ m.content }}{% endfor %}"
)


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def client(engine: FakeEngine) -> Iterator[TestClient]:
    yield from fake_client(engine)


def _chunks(text: str) -> list[dict]:
    frames = [f.removeprefix("data: ") for f in text.split("\n\n") if f]
    assert frames[-1] == "[DONE]"
    return [orjson.loads(f) for f in frames[:-1]]


@pytest.mark.parametrize("include_usage", [True, False])
def test_chat_continuous_usage_on_every_chunk(client: TestClient, include_usage: bool) -> None:
    options = {"include_usage": include_usage, "continuous_usage_stats": True}
    r = client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hey"}], "max_tokens": 3, "n": 2,
        "stream": True, "stream_options": options})  # fmt: skip
    chunks = _chunks(r.text)
    num_prompt = len("<user>hey<assistant>")  # the fake's template, one token per byte
    choice_chunks = [c for c in chunks if c["choices"]]
    # role chunks (2), then 3 tokens for each of the 2 choices, one per chunk
    assert [c["usage"]["completion_tokens"] for c in choice_chunks] == [0, 0, 1, 2, 3, 4, 5, 6]
    for c in chunks:
        u = c["usage"]
        assert u["prompt_tokens"] == num_prompt
        assert u["total_tokens"] == num_prompt + u["completion_tokens"]
    assert (chunks[-1]["choices"] == []) == include_usage
    if include_usage:
        assert chunks[-1]["usage"]["completion_tokens"] == 6


def test_completion_continuous_usage_on_every_chunk(client: TestClient) -> None:
    r = client.post("/v1/completions", json={
        "prompt": ["ab", "cde"], "max_tokens": 2, "stream": True,
        "stream_options": {"continuous_usage_stats": True}})  # fmt: skip
    chunks = _chunks(r.text)
    assert len(chunks) == 4 and all(c["choices"] for c in chunks)
    generated = [c["usage"]["completion_tokens"] for c in chunks]
    assert generated == [1, 2, 3, 4]
    assert {c["usage"]["prompt_tokens"] for c in chunks} == {5}


def test_without_continuous_usage_chunks_carry_no_usage(client: TestClient) -> None:
    r = client.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hey"}], "max_tokens": 2, "stream": True},
    )
    assert all("usage" not in c for c in _chunks(r.text))


def test_message_name_reaches_the_chat_template(client: TestClient, engine: FakeEngine) -> None:
    engine.chat_template = ChatTemplate(NAMED_TEMPLATE, bos_token=None, eos_token=None)  # type: ignore[assignment]
    messages = [{"role": "system", "content": "S"},
                {"role": "user", "content": "hi", "name": "ada"}]  # fmt: skip
    r = client.post("/tokenize", json={"messages": messages})
    assert r.status_code == 200, r.text
    assert bytes(r.json()["tokens"]).decode() == "[system]S[user ada]hi"
    r = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 1})
    assert r.status_code == 200
    assert r.json()["usage"]["prompt_tokens"] == len("[system]S[user ada]hi")
