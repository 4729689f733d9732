"""POST /v1/rerank (and /v2/rerank, where Cohere's v2 client posts) and POST /v1/score: every (query, document) pair rendered by the model's
score template (ScoreConfig), tokenized whole (as transformers tokenizes the same text), and
run as one prefill-only request, all admitted at once so that they batch (embeddings'
`embed_all`); the template puts the query first, so a rerank call's documents share its
prefix pages through the prefix cache. Each request's one "pooled" value is the
yes-probability the model runner computed at the last position (core/runner/pooler.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from starlette.responses import Response
from starlette.types import Receive

from pagedserve.core.outputs import RequestOutput
from pagedserve.core.pooling_params import PoolingParams, ScoreConfig
from pagedserve.openai_compat.common import errors
from pagedserve.openai_compat.common.http_responses import JSONResponse
from pagedserve.openai_compat.common.serving import ServingContext, new_id, off_loop
from pagedserve.openai_compat.common.streaming import until_disconnect
from pagedserve.openai_compat.embeddings.serving import EmbeddingService
from pagedserve.openai_compat.rerank.protocol import RerankRequest, ScoreRequest


def not_a_reranker(model: str, task: str) -> errors.APIError:
    return errors.invalid(
        f"The model `{model}` cannot score: this server runs it for task {task}. Serve a "
        "reranker (a causal LM that answers yes or no, such as Qwen3-Reranker) with "
        "--task score.",
        param="model",
        code="model_not_supported",
    )


def scoring_only(model: str, route: str) -> errors.APIError:
    """What a generation or embedding route answers on a server of task score."""
    return errors.invalid(
        f"The model `{model}` serves task score on this server: {route} is not available; "
        "use /v1/rerank or /v1/score (or start the server with --task generate).",
        param="model",
        code="model_not_supported",
    )


class RerankService:
    def __init__(self, ctx: ServingContext) -> None:
        self.ctx = ctx
        self._runner = EmbeddingService(ctx)

    async def rerank(self, req: RerankRequest, receive: Receive) -> Response:
        texts = req.texts()
        if req.max_tokens_per_doc is not None:
            texts = await off_loop(sum(map(len, texts)), self._cut, texts, req.max_tokens_per_doc)
        scores, num_tokens = await self._scores([(req.query, t) for t in texts], "documents",
                                                receive)  # fmt: skip
        order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
        results = []
        for i in order[: req.top_n or len(order)]:
            result: dict[str, Any] = {"index": i, "relevance_score": scores[i]}
            if req.return_documents:
                result["document"] = req.document(i)
            results.append(result)
        return JSONResponse({
            "id": new_id("rerank"),
            "model": self.ctx.model_name,
            "results": results,
            "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens},
            "meta": {"api_version": {"version": "2"},
                     "billed_units": {"input_tokens": num_tokens, "search_units": 1}},
        })  # fmt: skip

    def _cut(self, texts: list[str], max_tokens: int) -> list[str]:
        """Each text cut to its first `max_tokens` tokens (read as plain text)."""
        tokenizer = self.ctx.engine.tokenizer
        cut = []
        for text in texts:
            ids = tokenizer.encode_plain(text)
            cut.append(text if len(ids) <= max_tokens else tokenizer.decode(ids[:max_tokens]))
        return cut

    async def score(self, req: ScoreRequest, receive: Receive) -> Response:
        scores, num_tokens = await self._scores(req.pairs(), "text_2", receive)
        return JSONResponse({
            "id": new_id("score"),
            "object": "list",
            "created": int(time.time()),
            "model": self.ctx.model_name,
            "data": [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)],
            "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens,
                      "completion_tokens": 0},
        })  # fmt: skip

    async def _scores(
        self, pairs: list[tuple[str, str]], param: str, receive: Receive
    ) -> tuple[list[float], int]:
        """Each pair's score, in order, and the prompt tokens they took."""
        ctx = self.ctx
        info = ctx.engine.model_info
        score = info.pooler.score if info.pooler is not None else None
        if score is None:
            raise not_a_reranker(ctx.model_name, info.task)
        prompts = await self._token_ids(score, pairs, param)
        run = self._runner.embed_all(new_id("score"), prompts, PoolingParams())
        finals = await until_disconnect(receive, run)
        return [_score_of(output) for output in finals], sum(len(p) for p in prompts)

    async def _token_ids(
        self, score: ScoreConfig, pairs: list[tuple[str, str]], param: str
    ) -> list[list[int]]:
        """Each pair's prompt as token ids; one too long for the context is a 400 naming
        `param` (the documents: the query is the same in each)."""
        tokenizer = self.ctx.engine.tokenizer
        max_len = self.ctx.engine.model_info.max_model_len
        texts = [score.render(query, document) for query, document in pairs]
        prompts = await off_loop(sum(map(len, texts)), _encode_all, tokenizer.encode, texts)
        for i, ids in enumerate(prompts):
            if len(ids) > max_len:
                raise errors.invalid(
                    f"This model's maximum context length is {max_len} tokens. However, pair "
                    f"{i} (the query and {param}[{i}] in the score template) has {len(ids)} "
                    "tokens. Shorten it.",
                    param=param,
                    code="context_length_exceeded",
                )
        return prompts


def _encode_all(encode: Callable[[str], list[int]], texts: list[str]) -> list[list[int]]:
    return [encode(text) for text in texts]


def _score_of(output: RequestOutput) -> float:
    if not output.embedding:
        raise RuntimeError(f"score request {output.request_id} ended without a score")
    return float(output.embedding[0])
