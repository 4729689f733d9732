"""The server's state: what every route reaches through `request.app.state.server`."""

from __future__ import annotations

import time

from pagedserve.core.engine_client import EngineClient
from pagedserve.openai_compat.chat.serving import ChatService
from pagedserve.openai_compat.common import errors
from pagedserve.openai_compat.common.metrics import ServerMetrics
from pagedserve.openai_compat.common.serving import ServingContext
from pagedserve.openai_compat.completions.serving import CompletionService
from pagedserve.openai_compat.embeddings.serving import EmbeddingService
from pagedserve.openai_compat.infill.serving import InfillService
from pagedserve.openai_compat.messages.serving import MessagesService
from pagedserve.openai_compat.rerank.serving import RerankService
from pagedserve.openai_compat.responses.serving import ResponsesService
from pagedserve.openai_compat.responses.store import ResponseStore
from pagedserve.openai_compat.server_config import ServerConfig


class ServerState:
    """Everything the routes reach; filled in once the engine has loaded."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.started = int(time.time())
        self.engine: EngineClient | None = None
        self.ctx: ServingContext | None = None
        self.chat: ChatService | None = None
        self.completion: CompletionService | None = None
        self.infill: InfillService | None = None
        self.embeddings: EmbeddingService | None = None
        self.responses: ResponsesService | None = None
        self.messages: MessagesService | None = None
        self.rerank: RerankService | None = None
        self.metrics = ServerMetrics(config.served_model_name or "", lambda: self.engine)

    def attach(self, engine: EngineClient) -> None:
        name = self.config.served_model_name or engine.model_info.name
        self.metrics = ServerMetrics(name, lambda: self.engine)
        self.ctx = ServingContext(
            engine,
            name,
            self.metrics,
            tool_call_parser=self.config.tool_call_parser,
            reasoning_parser=self.config.reasoning_parser,
        )
        self.chat = ChatService(self.ctx)
        self.completion = CompletionService(self.ctx)
        self.infill = InfillService(self.ctx)
        self.embeddings = EmbeddingService(self.ctx)
        self.rerank = RerankService(self.ctx)
        config = self.config
        store = ResponseStore(config.response_store_size, config.response_store_mb << 20,
                              config.response_store_ttl)  # fmt: skip
        self.metrics.watch_response_store(store)
        self.responses = ResponsesService(self.ctx, store)
        self.messages = MessagesService(self.ctx)
        self.engine = engine

    def ready(self) -> ServingContext:
        """The serving context, or a 503 while loading or after an engine fault."""
        if self.ctx is None:
            raise errors.unavailable("The model is still loading.")
        if self.ctx.engine.errored:
            raise errors.unavailable("The engine stopped after a fault; see the server log.")
        return self.ctx
