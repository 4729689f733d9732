"""A small stand-in for AsyncEngine: byte tokenizer, echoing template, scripted outputs.

Output k of a request is the letters "abc..." (one token per letter), so every shape the server
builds can be checked exactly without a model.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from pagedserve.core.errors import ContextLengthError, QueueFullError
from pagedserve.core.outputs import (
    CompletionOutput,
    EngineStats,
    RequestMetrics,
    RequestOutput,
    TokenLogprob,
)
from pagedserve.core.sampling_params import SamplingParams

EOS = 256


class ByteTokenizer:
    vocab_size = 257
    eos_token_ids = (EOS,)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(text.encode())

    def decode(self, token_ids: list[int]) -> str:
        return bytes(t for t in token_ids if t < 256).decode(errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        return bytes([token_id]) if token_id < 256 else b""

    def token_str(self, token_id: int) -> str:
        return self.token_bytes(token_id).decode(errors="replace")


class TagTemplate:
    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        text = "".join(f"<{m['role']}>{m['content']}" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")


def _logprob(token_id: int, k: int) -> TokenLogprob:
    top = [(token_id, -0.5), (token_id + 1, -1.5), (token_id + 2, -2.5)][:k]
    return TokenLogprob(token_id, -0.5, 1, top)


class FakeEngine:
    model_name = "fake-model"
    max_model_len = 64
    batch_invariant = True
    page_size = 16
    num_pages = 8

    def __init__(self, token_delay: float = 0.0, default_max_tokens: int = 5) -> None:
        self.tokenizer = ByteTokenizer()
        self.chat_template: TagTemplate | None = TagTemplate()
        self.token_delay = token_delay
        self.default_max_tokens = default_max_tokens
        self.errored = False
        self.queue_full = False
        self.fail_requests = False
        self.active: set[str] = set()
        self.aborted: list[str] = []
        self.seen_params: list[SamplingParams] = []

    def check_admission(self, num_prompt_tokens: int, params: SamplingParams) -> None:
        if num_prompt_tokens + (params.max_tokens or 0) > self.max_model_len:
            raise ContextLengthError(f"{num_prompt_tokens} tokens do not fit {self.max_model_len}")
        if self.queue_full:
            raise QueueFullError("full")

    async def generate(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams
    ) -> AsyncIterator[RequestOutput]:
        self.check_admission(len(prompt_token_ids), params)
        self.seen_params.append(params)
        self.active.add(request_id)
        metrics = RequestMetrics(time.monotonic(), num_prompt_tokens=len(prompt_token_ids))
        finished = False
        try:
            if self.fail_requests:
                out = CompletionOutput(0, finish_reason="error")
                yield RequestOutput(request_id, prompt_token_ids, [out], True, error="boom")
                return
            num = params.max_tokens or self.default_max_tokens
            prompt_lps = None
            if params.prompt_logprobs is not None:
                k = params.prompt_logprobs
                prompt_lps = [None] + [_logprob(t, k) for t in prompt_token_ids[1:]]
            for step in range(num):
                await asyncio.sleep(self.token_delay)
                token = ord("a") + step % 26
                last = step == num - 1
                outs = [
                    CompletionOutput(
                        index,
                        chr(token),
                        [token],
                        [_logprob(token, params.logprobs)] if params.logprobs is not None else None,
                        "length" if last else None,
                    )
                    for index in range(params.n)
                ]
                out = RequestOutput(request_id, prompt_token_ids, outs, last)
                if step == 0:
                    out.prompt_logprobs = prompt_lps
                if last:
                    metrics.first_token_time = metrics.finished_time = time.monotonic()
                    metrics.num_generated_tokens = num * params.n
                    out.metrics = metrics
                finished = last
                yield out
        finally:
            self.active.discard(request_id)
            if not finished:
                self.aborted.append(request_id)

    def stats(self) -> EngineStats:
        used = len(self.active)
        return EngineStats(used, 0, self.num_pages, self.page_size, self.num_pages - used, used, 0,
                           10, 4, 0)  # fmt: skip

    async def shutdown(self) -> None:
        return None
