"""Anthropic's /v1/messages next to /v1/chat/completions on one server (issue 40's figure): the
same 32 chat requests at once, streamed, greedy, through the anthropic SDK and the OpenAI SDK in
alternating waves; output tokens per second of each wave, medians, and their ratio.

    python -m bench.serving.messages_overhead [--waves 3] [--concurrency 32] [--max-tokens 64]

Both paths run the same engine and chat template; the difference is the protocol layer (the
Messages body turned into a chat request, Anthropic's event stream). The CPU model and the load
average are printed: a figure is compared only within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

from anthropic import AsyncAnthropic
from openai import AsyncOpenAI

from bench.common.server import API_KEY, start_server, stop_server
from pagedserve.core.ops.cpu_features import cpu_model

PROMPTS = [f"Write a short story about robot number {i} and its garden." for i in range(256)]


async def chat_wave(client: AsyncOpenAI, model: str | list[str], n: int, max_tokens: int) -> int:
    """n streamed greedy chat requests at once (request i names models[i % len(models)]);
    the output tokens they generated."""
    models = [model] if isinstance(model, str) else model

    async def one(i: int) -> int:
        stream = await client.chat.completions.create(
            model=models[i % len(models)], messages=[{"role": "user", "content": PROMPTS[i]}],
            stream=True, max_tokens=max_tokens, temperature=0,
            stream_options={"include_usage": True},
        )  # fmt: skip
        tokens = 0
        async for chunk in stream:
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
        return tokens

    return sum(await asyncio.gather(*(one(i) for i in range(n))))


async def messages_wave(client: AsyncAnthropic, model: str, n: int, max_tokens: int) -> int:
    async def one(i: int) -> int:
        async with client.messages.stream(
            model=model, messages=[{"role": "user", "content": PROMPTS[i]}],
            max_tokens=max_tokens, extra_body={"temperature": 0},
        ) as stream:  # fmt: skip
            message = await stream.get_final_message()
        return message.usage.output_tokens

    return sum(await asyncio.gather(*(one(i) for i in range(n))))


async def run(base_url: str, model: str, args: argparse.Namespace) -> dict[str, list[float]]:
    openai = AsyncOpenAI(base_url=base_url + "/v1", api_key=API_KEY, max_retries=0)
    anthropic = AsyncAnthropic(base_url=base_url, api_key=API_KEY, max_retries=0)
    rates: dict[str, list[float]] = {"chat": [], "messages": []}
    await chat_wave(openai, model, args.concurrency, 8)  # warm-up
    for wave in range(args.waves):
        order = ["chat", "messages"] if wave % 2 == 0 else ["messages", "chat"]
        for name in order:
            start = time.perf_counter()
            if name == "chat":
                tokens = await chat_wave(openai, model, args.concurrency, args.max_tokens)
            else:
                tokens = await messages_wave(anthropic, model, args.concurrency, args.max_tokens)
            rates[name].append(tokens / (time.perf_counter() - start))
    return rates


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--waves", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        server = start_server(Path(tmp), "--api-key", API_KEY)
        try:
            load = os.getloadavg()
            rates = asyncio.run(run(server.base_url, server.model, args))
        finally:
            stop_server(server)
    chat, messages = statistics.median(rates["chat"]), statistics.median(rates["messages"])
    print(f"CPU: {cpu_model()}; c={args.concurrency}, {args.max_tokens} tokens out, "
          f"{args.waves} waves each; load average before {load[0]:.2f}, after "
          f"{os.getloadavg()[0]:.2f}")  # fmt: skip
    print("| path | output tok/s per wave | median |\n|---|---|---:|")
    for name, values in rates.items():
        print(f"| {name} | {', '.join(f'{v:.1f}' for v in values)} | "
              f"{statistics.median(values):.1f} |")  # fmt: skip
    print(f"messages / chat: {messages / chat:.3f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
