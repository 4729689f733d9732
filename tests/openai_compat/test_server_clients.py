"""LangChain and `curl -N` against the real server process."""

from __future__ import annotations

import shutil
import subprocess

import orjson
import pytest
from langchain_openai import ChatOpenAI, OpenAI

from bench.common.server import API_KEY, Server


@pytest.fixture(scope="module")
def chat(server: Server) -> ChatOpenAI:
    return ChatOpenAI(
        model=server.model, base_url=server.base_url + "/v1", api_key=API_KEY,
        max_tokens=5, temperature=0, max_retries=0,
    )  # fmt: skip


def test_langchain_chat_invoke_stream_batch(chat: ChatOpenAI) -> None:
    whole = chat.invoke("Say hello.")
    assert isinstance(whole.content, str) and whole.content
    streamed = "".join(str(chunk.content) for chunk in chat.stream("Say hello."))
    assert streamed  # not compared with `whole`: see test_server_openai.py on greedy near-ties
    answers = chat.batch(["Say hello.", "Count to three."])
    assert len(answers) == 2 and all(isinstance(a.content, str) and a.content for a in answers)


def test_langchain_completions_llm(server: Server) -> None:
    llm = OpenAI(
        model=server.model, base_url=server.base_url + "/v1", api_key=API_KEY,
        max_tokens=4, temperature=0, max_retries=0,
    )  # fmt: skip
    text = llm.invoke("One, two, three,")
    assert isinstance(text, str) and text
    assert "".join(llm.stream("One, two, three,"))


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_curl_streaming(server: Server) -> None:
    body = {"model": server.model, "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 4, "stream": True}  # fmt: skip
    out = subprocess.run(
        ["curl", "-sS", "-N", server.base_url + "/v1/chat/completions",
         "-H", "Content-Type: application/json", "-H", f"Authorization: Bearer {API_KEY}",
         "-d", orjson.dumps(body).decode()],
        capture_output=True, timeout=120, check=True,
    ).stdout.decode()  # fmt: skip
    frames = [f for f in out.split("\n\n") if f]
    assert all(f.startswith("data: ") for f in frames)
    assert frames[-1] == "data: [DONE]"
    chunks = [orjson.loads(f.removeprefix("data: ")) for f in frames[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
