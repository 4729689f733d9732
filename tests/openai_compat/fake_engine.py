"""A small EngineClient: byte tokenizer, tag template, scripted outputs.

Output k of a request is the letters "abc..." (one token per letter), so every shape the server
builds can be checked exactly without a model.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Sequence

from pagedserve.core.engine_client import EngineClient, ModelInfo
from pagedserve.core.errors import ContextLengthError, QueueFullError
from pagedserve.core.lora_request import LoRAError, LoRANotFoundError, LoRARequest
from pagedserve.core.multimodal.inputs import MultiModalInputs
from pagedserve.core.multimodal.processor import ImageProcessor
from pagedserve.core.outputs import (
    CompletionOutput,
    EngineStats,
    RequestMetrics,
    RequestOutput,
    TokenLogprob,
)
from pagedserve.core.pooling_params import PoolingParams
from pagedserve.core.sampling_params import SamplingParams, StructuredOutputs
from pagedserve.core.tokenizers.chat_template import ChatTemplate
from pagedserve.core.tokenizers.load import Tokenizer, TokenizerMeta

EOS = 256
TAG_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
"""Each message as <role>content, then <assistant> (rendered by the real ChatTemplate)."""


class ByteTokenizer(Tokenizer):
    """One token per UTF-8 byte, and EOS."""

    def __init__(self) -> None:
        super().__init__(TokenizerMeta(eos_token_ids=frozenset({EOS})), vocab_size=257)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(text.encode())

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return bytes(t for t in token_ids if t < 256).decode(errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        return bytes([token_id]) if token_id < 256 else b""

    def is_special(self, token_id: int) -> bool:
        return token_id == EOS

    def token_str(self, token_id: int) -> str:
        return self.token_bytes(token_id).decode(errors="replace")


def _logprob(token_id: int, k: int) -> TokenLogprob:
    top = [(token_id, -0.5), (token_id + 1, -1.5), (token_id + 2, -2.5)][:k]
    return TokenLogprob(token_id, -0.5, 1, top)


class FakeStream:
    """A RequestStream over the fake's scripted async generator."""

    def __init__(self, engine: FakeEngine, request_id: str, outputs: AsyncIterator[RequestOutput]):
        self._engine = engine
        self._request_id = request_id
        self._outputs = outputs

    def __aiter__(self) -> FakeStream:
        return self

    async def __anext__(self) -> RequestOutput:
        return await self._outputs.__anext__()

    def close(self) -> None:
        self._engine.abort(self._request_id)


class FakeEngine:
    def __init__(self, token_delay: float = 0.0, default_max_tokens: int = 5) -> None:
        self.tokenizer = ByteTokenizer()
        self.chat_template: ChatTemplate | None = ChatTemplate(
            TAG_TEMPLATE, bos_token=None, eos_token=None
        )
        self.model_info = ModelInfo(
            name="fake-model",
            max_model_len=64,
            vocab_size=self.tokenizer.vocab_size,
            page_size=16,
            num_pages=8,
            dtype="float32",
            device="cpu",
            batch_invariant=True,
        )
        self.token_delay = token_delay
        self.default_max_tokens = default_max_tokens
        self.errored = False
        self.queue_full = False
        self.fail_requests = False
        self.active: set[str] = set()
        self.aborted: list[str] = []
        self.seen_params: list[SamplingParams] = []
        self.num_generated = 0
        self.finished_reasons: dict[str, int] = {}
        self.seen_prompts: list[list[int]] = []
        self.compiled: list[StructuredOutputs] = []
        self.compile_gate: threading.Event | None = None
        self.script: str | None = None
        """When set, every output is this text (one character per token), then "stop"."""
        self.image_processor: ImageProcessor | None = None
        self.loras: dict[str, LoRARequest] = {}
        self.seen_loras: list[LoRARequest | None] = []
        """Set by a test to take images (a text-only model by default)."""
        self.seen_multimodal: list[MultiModalInputs | None] = []

    def compile_grammar(self, spec: StructuredOutputs) -> None:
        """Called on a worker thread by the server; `compile_gate` (if set) holds it there."""
        self.compiled.append(spec)
        if self.compile_gate is not None:
            assert self.compile_gate.wait(30), "compile_gate never opened"

    def _admit(self, num_prompt_tokens: int, params: SamplingParams) -> None:
        max_model_len = self.model_info.max_model_len
        if num_prompt_tokens + (params.max_tokens or 0) > max_model_len:
            raise ContextLengthError(f"{num_prompt_tokens} tokens do not fit {max_model_len}")
        if self.queue_full:
            raise QueueFullError("full")

    def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        multimodal: MultiModalInputs | None = None,
        lora_request: LoRARequest | None = None,
    ) -> FakeStream:
        self._admit(len(prompt_token_ids), params)
        self.seen_loras.append(lora_request)
        self.seen_multimodal.append(multimodal)
        self.seen_params.append(params)
        self.seen_prompts.append(list(prompt_token_ids))
        self.active.add(request_id)
        return FakeStream(self, request_id, self._outputs(request_id, prompt_token_ids, params))

    def embed(
        self, request_id: str, prompt_token_ids: list[int], params: PoolingParams
    ) -> FakeStream:
        """The fake is a generation model: as AsyncEngine.embed on one, it refuses."""
        raise ValueError(f"{self.model_info.name} is not an embedding model")

    def abort(self, request_id: str) -> None:
        if request_id in self.active:
            self.active.discard(request_id)
            self.aborted.append(request_id)

    async def _outputs(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams
    ) -> AsyncIterator[RequestOutput]:
        metrics = RequestMetrics(time.monotonic(), num_prompt_tokens=len(prompt_token_ids))
        finished = False
        try:
            if self.fail_requests:
                failed = CompletionOutput(0, finish_reason="error")
                yield RequestOutput(request_id, prompt_token_ids, [failed], True, error="boom")
                return
            num = params.max_tokens or self.default_max_tokens
            if self.script is not None:
                num = min(num, len(self.script))
            prompt_lps = None
            if params.prompt_logprobs is not None:
                k = params.prompt_logprobs
                prompt_lps = [None] + [_logprob(t, k) for t in prompt_token_ids[1:]]
            for step in range(num):
                await asyncio.sleep(self.token_delay)
                token = ord("a") + step % 26 if self.script is None else ord(self.script[step])
                last = step == num - 1
                reason = "stop" if self.script is not None and num == len(self.script) else "length"
                outs = [
                    CompletionOutput(
                        index,
                        chr(token),
                        [token],
                        [_logprob(token, params.logprobs)] if params.logprobs is not None else None,
                        reason if last else None,
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
                self.num_generated += params.n
                if last:
                    self._count_ended("length", params.n)
                yield out
        finally:
            if not finished:
                self.abort(request_id)
                self._count_ended("abort", params.n)
            self.active.discard(request_id)

    def _count_ended(self, reason: str, n: int) -> None:
        self.finished_reasons[reason] = self.finished_reasons.get(reason, 0) + n

    def stats(self) -> EngineStats:
        used = len(self.active)
        pages, size = self.model_info.num_pages, self.model_info.page_size
        return EngineStats(used, 0, pages, size, pages - used, used, 0,
                           10, 4, 0, self.num_generated, dict(self.finished_reasons))  # fmt: skip

    def list_loras(self) -> list[LoRARequest]:
        return list(self.loras.values())

    async def load_lora(self, name: str, path: str) -> LoRARequest:
        """Any path loads (the real reading is core/lora's, tested there)."""
        if name in self.loras:
            raise LoRAError(f"an adapter named {name!r} is already loaded")
        self.loras[name] = LoRARequest(name, len(self.loras) + 1, path)
        return self.loras[name]

    async def unload_lora(self, name: str) -> None:
        if self.loras.pop(name, None) is None:
            raise LoRANotFoundError(f"The model `{name}` does not exist.")

    async def shutdown(self) -> None:
        return None


def as_client(engine: FakeEngine) -> EngineClient:
    """Where mypy checks that FakeEngine is an EngineClient (tests/test_types.py)."""
    return engine
