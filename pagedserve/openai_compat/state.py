"""The server's state: what every route reaches through `request.app.state.server`."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from pagedserve.core.engine_client import EngineClient
from pagedserve.openai_compat.chat.serving import ChatService
from pagedserve.openai_compat.common import errors
from pagedserve.openai_compat.common.media import MediaConfig
from pagedserve.openai_compat.common.metrics import ServerMetrics
from pagedserve.openai_compat.common.serving import ServingContext
from pagedserve.openai_compat.completions.serving import CompletionService
from pagedserve.openai_compat.embeddings.serving import EmbeddingService
from pagedserve.openai_compat.infill.serving import InfillService
from pagedserve.openai_compat.messages.serving import MessagesService
from pagedserve.openai_compat.model_pool import ModelPool, ModelSpec, PoolLimits
from pagedserve.openai_compat.rerank.serving import RerankService
from pagedserve.openai_compat.responses.serving import ResponsesService
from pagedserve.openai_compat.responses.store import ResponseStore
from pagedserve.openai_compat.server_config import ServerConfig


class ModelServices:
    """One loaded model's serving context and each endpoint's service."""

    def __init__(self, ctx: ServingContext, store: ResponseStore) -> None:
        self.ctx = ctx
        self.chat = ChatService(ctx)
        self.completion = CompletionService(ctx)
        self.infill = InfillService(ctx)
        self.embeddings = EmbeddingService(ctx)
        self.rerank = RerankService(ctx)
        self.responses = ResponsesService(ctx, store)
        self.messages = MessagesService(ctx)


class ServerState:
    """Everything the routes reach: the model pool (the single-model server's is a pool of
    one, loaded at start-up), the metrics registry and the responses store all models share."""

    def __init__(
        self,
        config: ServerConfig,
        specs: Sequence[ModelSpec],
        limits: PoolLimits | None = None,
        catalog: bool = False,
        on_loaded: Callable[[EngineClient], None] | None = None,
        on_fatal: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.config = config
        self.started = int(time.time())
        self.metrics = ServerMetrics(config.model_name or "", lambda: None)
        self.store = ResponseStore(config.response_store_size, config.response_store_mb << 20,
                                   config.response_store_ttl)  # fmt: skip
        self._store_watched = False
        self.pool = ModelPool(
            specs, limits or PoolLimits(), catalog, self._build, self._drop, _answers_to,
            on_loaded, on_fatal,
        )  # fmt: skip

    def _build(self, name: str, engine: EngineClient) -> ModelServices:
        metrics = self.metrics.for_model(name, lambda: engine)
        if not self._store_watched:  # the store is the server's: unlabelled with several models
            self._store_watched = True
            (self.metrics if self.pool.catalog else metrics).watch_response_store(self.store)
        ctx = ServingContext(
            engine,
            name,
            metrics,
            tool_call_parser=self.config.tool_call_parser,
            reasoning_parser=self.config.reasoning_parser,
            media=media_config(self.config),
            # the single model's other --served-model-name names (a catalog's models have one)
            aliases=() if self.pool.catalog else self.config.served_model_name[1:],
        )
        return ModelServices(ctx, self.store)

    def _drop(self, name: str, services: ModelServices) -> None:
        self.metrics.forget_model(name)

    @asynccontextmanager
    async def serving(self, model: str | None) -> AsyncIterator[ModelServices]:
        """The services of the model a request names (loaded on demand; 404 for a name no
        model answers to), held until the block ends."""
        async with self.pool.use(model) as services:
            if services.ctx.engine.errored:
                raise errors.unavailable("The engine stopped after a fault; see the server log.")
            yield services

    def health(self) -> dict[str, Any]:
        """/health's body, or a 503 while the start-up load runs (or the one model's engine
        stopped after a fault)."""
        if self.pool.starting():
            raise errors.unavailable("The model is still loading.")
        statuses = {model.name: model.status for model in self.pool.states()}
        if not self.pool.catalog and "failed" in statuses.values():
            raise errors.unavailable("The engine stopped after a fault; see the server log.")
        return {"status": "ok", "models": statuses}

    def available(self) -> None:
        """The 503s a request gets before its body is read: the start-up load still runs, or
        the single-model server's engine stopped after a fault."""
        self.health()

    def loaded(self) -> list[ModelServices]:
        return [services for _, services in self.pool.loaded()]

    @property
    def engine(self) -> EngineClient | None:
        """The single-model server's engine (with several: the first loaded one)."""
        return self.pool.first_engine()

    @property
    def ctx(self) -> ServingContext | None:
        """The single-model server's serving context (with several: the first loaded one's)."""
        loaded = self.loaded()
        return loaded[0].ctx if loaded else None

    def ready(self) -> ServingContext:
        """The single-model server's serving context, or a 503 while it loads or after an
        engine fault (with several models: the first loaded one's)."""
        self.health()
        ctx = self.ctx
        if ctx is None:
            raise errors.unavailable("No model is loaded.")
        return ctx

    def responses_holding(self, response_id: str) -> ResponsesService:
        """The responses service running `response_id`, else any loaded model's (the store
        is shared: stored responses are found through any)."""
        loaded = self.loaded()
        for services in loaded:
            if response_id in services.responses.running:
                return services.responses
        if not loaded:
            raise errors.unavailable("No model is loaded.")
        return loaded[0].responses

    async def shutdown(self) -> None:
        """Background responses first (their engine requests abort), then the engines."""
        for services in self.loaded():
            await services.responses.shutdown()
        await self.pool.close()


def _answers_to(services: ModelServices, model: str) -> bool:
    """Whether a loaded model takes requests named `model` (its own name, or one its serving
    context accepts, such as an adapter's)."""
    try:
        services.ctx.check_model(model)
    except errors.APIError:
        return False
    return True


def media_config(config: ServerConfig) -> MediaConfig:
    """Where images may come from and how many (the server's media flags)."""
    return MediaConfig(
        allowed_local_media_path=config.allowed_local_media_path,
        fetch_timeout=config.media_fetch_timeout,
        max_bytes=config.media_max_bytes,
        max_images=config.limit_mm_per_prompt,
    )
