"""An engine that counts its open streams, so that the model pool knows when a model is idle.

`CountingEngine` is the EngineClient the services of a pooled model hold: every stream that
`generate` or `embed` opens holds the model until it ends (its last output read, an error, or
`close`), however long the response that reads it outlives its route handler (a streamed answer,
a background response).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pagedserve.core.engine_client import EngineClient, ModelInfo, RequestStream

if TYPE_CHECKING:
    from pagedserve.core.outputs import EngineStats, RequestOutput
    from pagedserve.core.sampling_params import StructuredOutputs
    from pagedserve.core.tokenizers.chat_template import ChatTemplate
    from pagedserve.core.tokenizers.load import Tokenizer


class CountedStream:
    """A RequestStream that calls `release` once, when it ends or is closed."""

    def __init__(self, stream: RequestStream, release: Callable[[], None]) -> None:
        self._stream = stream
        self._release: Callable[[], None] | None = release

    def __aiter__(self) -> CountedStream:
        return self

    async def __anext__(self) -> RequestOutput:
        try:
            output = await self._stream.__anext__()
        except BaseException:
            self._done()
            raise
        if output.finished:
            self._done()
        return output

    def close(self) -> None:
        try:
            self._stream.close()
        finally:
            self._done()

    def _done(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            release()

    def __del__(self) -> None:  # dropped unread: the inner stream aborts itself as it goes
        self._done()


class CountingEngine:
    """`engine` with its streams counted by `hold` / `release` (everything else passes)."""

    def __init__(
        self, engine: EngineClient, hold: Callable[[], None], release: Callable[[], None]
    ) -> None:
        self.inner = engine
        self._hold, self._release = hold, release

    @property
    def tokenizer(self) -> Tokenizer:
        return self.inner.tokenizer

    @property
    def chat_template(self) -> ChatTemplate | None:
        return self.inner.chat_template

    @property
    def model_info(self) -> ModelInfo:
        return self.inner.model_info

    @property
    def errored(self) -> bool:
        return self.inner.errored

    def generate(self, *args: Any, **kwargs: Any) -> RequestStream:
        return self._counted(self.inner.generate(*args, **kwargs))

    def embed(self, *args: Any, **kwargs: Any) -> RequestStream:
        return self._counted(self.inner.embed(*args, **kwargs))

    def _counted(self, stream: RequestStream) -> RequestStream:
        self._hold()  # after the engine admitted it: a refusal holds nothing
        return CountedStream(stream, self._release)

    def compile_grammar(self, spec: StructuredOutputs) -> None:
        self.inner.compile_grammar(spec)

    def abort(self, request_id: str) -> None:
        self.inner.abort(request_id)

    def stats(self) -> EngineStats:
        return self.inner.stats()

    async def shutdown(self) -> None:
        await self.inner.shutdown()

    def __getattr__(self, name: str) -> Any:
        """What an engine has beyond the protocol (e.g. adapters) passes through."""
        return getattr(self.inner, name)
