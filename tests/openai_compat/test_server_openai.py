"""The official OpenAI SDK against a real server process with the default model on the CPU."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from bench.common.server import API_KEY, Server
from tests.openai_compat.conftest import BODY_LIMIT

MESSAGES = [{"role": "user", "content": "Name a colour."}]


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0)


def test_models(client: openai.OpenAI, server: Server) -> None:
    models = client.models.list().data
    assert [m.id for m in models] == [server.model]
    assert client.models.retrieve(server.model).id == server.model
    # The default server says it is batch-invariant (issue 16) on every CPU: its linears are the
    # GGUF blocks on the int8 kernels (the same bits at every ISA level), attention native.
    assert models[0].batch_invariant is True  # type: ignore[attr-defined]
    # --quantization auto (the default): the Q4_1 file's blocks run on the int8 kernels.
    weights = models[0].weights  # type: ignore[attr-defined]
    assert weights.startswith("Q4_1 x 210, Q8_0 x 1 kept quantized (native "), weights
    # ... and says which linear path runs and the CPU's features (issue 12, --cpu-linear).
    assert "; linears: GGUF blocks on their native quantized kernels; cpu: " in weights, weights
    assert f"weights: {weights}" in server.log()


# Greedy text is not compared across requests: in bf16 a prefix-cache hit or another batch
# shape can flip a near-tie (the engine's tests own determinism); shapes are checked here.
def test_chat_sync_shape(client: openai.OpenAI, server: Server) -> None:
    kwargs = {"model": server.model, "messages": MESSAGES, "max_tokens": 6, "temperature": 0}
    first = client.chat.completions.create(**kwargs)
    assert first.id.startswith("chatcmpl-") and first.object == "chat.completion"
    choice = first.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert first.usage.completion_tokens <= 6
    assert first.usage.total_tokens == first.usage.prompt_tokens + first.usage.completion_tokens


def test_chat_stream_shape(client: openai.OpenAI, server: Server) -> None:
    kwargs = {"model": server.model, "messages": MESSAGES, "max_tokens": 6, "temperature": 0}
    stream = client.chat.completions.create(
        **kwargs, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    finals = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert len(finals) == 1
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens >= 1


def test_n2_and_chat_logprobs(client: openai.OpenAI, server: Server) -> None:
    r = client.chat.completions.create(
        model=server.model, messages=MESSAGES, max_tokens=4, n=2, seed=1, temperature=0.8,
        logprobs=True, top_logprobs=3,
    )  # fmt: skip
    assert sorted(c.index for c in r.choices) == [0, 1]
    for choice in r.choices:
        content = choice.logprobs.content
        assert 1 <= len(content) <= 4
        for item in content:
            assert item.logprob <= 0 and isinstance(item.bytes, list)
            assert len(item.top_logprobs) == 3
            assert item.top_logprobs[0].logprob >= item.top_logprobs[-1].logprob


def test_completions_echo_logprobs_for_lm_eval(client: openai.OpenAI, server: Server) -> None:
    prompt = "The capital of France is Paris"
    r = client.completions.create(
        model=server.model, prompt=prompt, echo=True, max_tokens=0, logprobs=1, temperature=0
    )
    choice = r.choices[0]
    assert choice.text == prompt
    lp = choice.logprobs
    assert lp.token_logprobs[0] is None and all(x <= 0 for x in lp.token_logprobs[1:])
    assert len(lp.tokens) == r.usage.prompt_tokens == len(lp.text_offset)
    assert "".join(lp.tokens) == prompt and r.usage.completion_tokens == 0


def test_completions_batch_of_prompts(client: openai.OpenAI, server: Server) -> None:
    r = client.completions.create(
        model=server.model, prompt=["One, two,", "Red, green,"], n=2, max_tokens=3, temperature=0
    )
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert r.choices[0].text == r.choices[1].text  # greedy: both outputs of a prompt agree


def test_completions_null_max_tokens_means_16(server: Server) -> None:
    # OpenAI's legacy completions document max_tokens as "defaults to 16", null included (issue
    # 41: null once meant up to the context and generated 8,191 tokens). The SDK sends None as
    # null; ignore_eos keeps the model from stopping first, so only the limit can end it.
    seen: list[bytes] = []
    http = httpx.Client(event_hooks={"request": [lambda r: seen.append(r.read())]})
    sdk = openai.OpenAI(base_url=server.base_url + "/v1", api_key=API_KEY, http_client=http)
    with sdk:
        r = sdk.completions.create(
            model=server.model, prompt="Once upon a time", max_tokens=None, logprobs=1,
            temperature=0, extra_body={"ignore_eos": True},
        )  # fmt: skip
    assert b'"max_tokens":null' in seen[0].replace(b" ", b"")
    assert r.usage.completion_tokens == 16 and r.choices[0].finish_reason == "length"
    assert len(r.choices[0].logprobs.tokens) == 16


def test_async_client_concurrent(server: Server) -> None:
    async def run() -> list[str]:
        client = openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key=API_KEY)
        async with client:
            calls = [
                client.completions.create(model=server.model, prompt=f"{i} + {i} =", max_tokens=3)
                for i in range(4)
            ]
            return [r.choices[0].text for r in await asyncio.gather(*calls)]

    assert len(asyncio.run(run())) == 4


def test_errors_raise_the_sdk_classes(client: openai.OpenAI, server: Server) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model=server.model, messages=MESSAGES, temperature=-1)
    assert bad.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError) as long:
        client.completions.create(model=server.model, prompt="hi " * 2000, max_tokens=1)
    assert long.value.code == "context_length_exceeded"
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="gpt-4o", messages=MESSAGES)
    assert missing.value.code == "model_not_found"
    wrong = openai.OpenAI(base_url=server.base_url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()
    with pytest.raises(openai.BadRequestError) as unsupported:
        client.chat.completions.create(
            model=server.model, messages=MESSAGES, extra_body={"functions": [{"name": "f"}]}
        )
    assert unsupported.value.body["param"] == "functions"


def test_open_endpoints_and_tokenize(server: Server) -> None:
    assert httpx.get(server.base_url + "/health").status_code == 200
    assert "vllm:cache_config_info" in httpx.get(server.base_url + "/metrics").text
    headers = {"Authorization": f"Bearer {API_KEY}"}
    tokens = httpx.post(server.base_url + "/tokenize", json={"prompt": "Hello world"},
                        headers=headers).json()["tokens"]  # fmt: skip
    text = httpx.post(server.base_url + "/detokenize", json={"tokens": tokens},
                      headers=headers).json()["prompt"]  # fmt: skip
    assert text.strip() == "Hello world"
    big = httpx.post(server.base_url + "/v1/completions", content=b"x" * (BODY_LIMIT + 1),
                     headers=headers, timeout=60)  # fmt: skip
    assert big.status_code == 413
