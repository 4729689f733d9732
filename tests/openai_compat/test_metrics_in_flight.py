"""/metrics read as a client would, right after the first SSE chunk of a streamed chat
completion (issue 41: running + waiting both read 0 then, 4 runs in 4): the request in flight
counts as running or waiting."""

from __future__ import annotations

import openai

from bench.common.server import API_KEY, Server


def test_a_streamed_request_counts_from_its_first_chunk(server: Server) -> None:
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0)
    with client:
        for _ in range(4):
            stream = client.chat.completions.create(
                model=server.model, messages=[{"role": "user", "content": "Name a colour."}],
                max_tokens=8, stream=True, extra_body={"ignore_eos": True},
            )  # fmt: skip
            with stream:
                first = next(iter(stream))
                assert first.choices[0].delta.role == "assistant"
                samples = server.metrics()
                in_flight = server.metric("vllm:num_requests_running", samples) + server.metric(
                    "vllm:num_requests_waiting", samples
                )
                assert in_flight >= 1, samples
                rest = list(stream)
            assert rest[-1].choices[0].finish_reason == "length"
