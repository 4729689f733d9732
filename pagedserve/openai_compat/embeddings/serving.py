"""POST /v1/embeddings: one prefill-only engine request per input, all admitted at once so that
they batch with each other (and with whatever else runs; the rest as earlier ones finish when
the waiting queue is full); the vectors come back in input order.

Texts are tokenized with the model's special tokens and its sentence-transformers default
prompt (when it names one); token-id inputs are taken as they are. `truncate_prompt_tokens`
keeps each input's last k tokens, as vLLM does. `encoding_format: base64` is each vector's
little-endian float32 bytes, base64-encoded, which is what the OpenAI SDK decodes.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import numpy as np
from starlette.responses import Response
from starlette.types import Receive

from pagedserve.core.engine_client import RequestStream
from pagedserve.core.outputs import RequestOutput
from pagedserve.core.pooling_params import PoolerConfig, PoolingParams
from pagedserve.openai_compat.common import errors
from pagedserve.openai_compat.common.http_responses import JSONResponse
from pagedserve.openai_compat.common.serving import (
    ServingContext,
    collect,
    engine_errors,
    new_id,
    off_loop,
    require_in_vocabulary,
)
from pagedserve.openai_compat.common.streaming import until_disconnect
from pagedserve.openai_compat.embeddings.protocol import EmbeddingRequest

_LITTLE_F32 = np.dtype("<f4")


def not_an_embedding_model(model: str, task: str = "generate") -> errors.APIError:
    routes = "/v1/rerank, /v1/score" if task == "score" else "/v1/chat/completions, /v1/completions"
    return errors.invalid(
        f"The model `{model}` is not an embedding model: this server runs it for task "
        f"{task} ({routes}). Serve an embedding model, or start the server with --task embed.",
        param="model",
        code="model_not_supported",
    )


def embedding_only(model: str, route: str) -> errors.APIError:
    """What a generation route answers on a server of task embed."""
    return errors.invalid(
        f"The model `{model}` serves task embed on this server: {route} is not available; "
        "use /v1/embeddings (or start the server with --task generate, where the model can "
        "generate).",
        param="model",
        code="model_not_supported",
    )


class EmbeddingService:
    def __init__(self, ctx: ServingContext) -> None:
        self.ctx = ctx

    async def create(self, req: EmbeddingRequest, receive: Receive) -> Response:
        ctx = self.ctx
        ctx.check_model(req.model)
        pooler = ctx.engine.model_info.pooler
        if pooler is None or pooler.score is not None:
            raise not_an_embedding_model(ctx.model_name, ctx.engine.model_info.task)
        try:
            pooler.check_dimensions(req.dimensions)
        except ValueError as exc:
            raise errors.invalid(str(exc), param="dimensions") from None
        prompts = await self._token_ids(req, pooler)
        params = PoolingParams(dimensions=req.dimensions)
        ctx.metrics.record_embedding_request(len(prompts))
        finals = await until_disconnect(receive, self.embed_all(new_id("embd"), prompts, params))
        return JSONResponse(self._response(req, finals, sum(len(p) for p in prompts)))

    async def _token_ids(self, req: EmbeddingRequest, pooler: PoolerConfig) -> list[list[int]]:
        """Each input's token ids, checked and truncated: every failure a 400 naming `input`."""
        info = self.ctx.engine.model_info
        tokenizer = self.ctx.engine.tokenizer
        prefix = pooler.prompts.get(pooler.default_prompt_name or "", "")
        prompts: list[list[int]] = []
        for item in req.inputs():
            if isinstance(item, str):
                text = prefix + item
                ids = await off_loop(len(text), tokenizer.encode, text, req.add_special_tokens)
            else:
                ids = item
            prompts.append(ids)
        limit = req.truncate_prompt_tokens
        if limit is not None:
            if limit == -1:
                limit = info.max_model_len
            if limit > info.max_model_len:
                raise errors.invalid(
                    f"truncate_prompt_tokens ({limit}) is larger than the model's maximum "
                    f"context length ({info.max_model_len}).",
                    param="truncate_prompt_tokens",
                )
            prompts = [ids[-limit:] for ids in prompts]  # the last k tokens, as vLLM keeps
        for i, ids in enumerate(prompts):
            if not ids:
                raise errors.invalid(f"Input {i} has no tokens.", param="input")
            require_in_vocabulary(ids, tokenizer.vocab_size, "input")
        return prompts

    async def embed_all(
        self, request_id: str, prompts: list[list[int]], params: PoolingParams
    ) -> list[RequestOutput]:
        """Every input's final output, in input order. Inputs are admitted at once, so they
        batch; when the waiting queue fills (`--max-waiting` below the number of inputs), the
        rest are admitted as this request's earlier ones finish, rather than the whole request
        being refused with a 429 that no retry could mend. A 429 comes only when none of its
        inputs got in. Leaving early (an error, the client gone) aborts the ones admitted."""
        finals: list[RequestOutput | None] = [None] * len(prompts)
        running: dict[asyncio.Future[list[RequestOutput]], tuple[int, RequestStream]] = {}
        admitted = 0

        def admit() -> None:
            nonlocal admitted
            while admitted < len(prompts):
                try:
                    stream = self._admit(f"{request_id}-{admitted}", prompts[admitted], params)
                except errors.APIError as exc:
                    if exc.status == 429 and running:
                        return  # our own inputs fill the queue: more when one finishes
                    raise
                task = asyncio.ensure_future(collect([stream], self.ctx.metrics, "input"))
                running[task] = (admitted, stream)
                admitted += 1

        try:
            admit()
            while running:
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    index, _ = running.pop(task)
                    finals[index] = task.result()[0]
                admit()
        finally:
            for task, (_, stream) in running.items():
                task.cancel()
                stream.close()  # aborts the request and frees its pages
        return [f for f in finals if f is not None]

    def _admit(self, request_id: str, prompt: list[int], params: PoolingParams) -> RequestStream:
        try:
            with engine_errors("input"):
                return self.ctx.engine.embed(request_id, prompt, params)
        except ValueError as exc:  # what check_pooling refuses past the checks above
            raise errors.invalid(str(exc), param="input") from None

    def _response(
        self, req: EmbeddingRequest, finals: list[RequestOutput], num_tokens: int
    ) -> dict[str, Any]:
        data = []
        for index, output in enumerate(finals):
            if output.embedding is None:
                raise RuntimeError(f"embedding request {output.request_id} ended without one")
            data.append(
                {"object": "embedding", "index": index,
                 "embedding": _encode(output.embedding, req.encoding_format)}
            )  # fmt: skip
        return {
            "object": "list",
            "data": data,
            "model": self.ctx.model_name,
            "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens},
        }


def _encode(vector: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(vector, dtype=_LITTLE_F32).tobytes()).decode("ascii")
    return vector
