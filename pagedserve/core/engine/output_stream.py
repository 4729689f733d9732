"""A request's side of AsyncEngine: its mailbox (filled on the event loop's thread) and the
OutputStream its reader iterates, which aborts the request on every early exit."""

from __future__ import annotations

import asyncio
from typing import Protocol

from pagedserve.core.outputs import RequestOutput


class Mailbox:
    """A request's mailbox; touched only on its event loop's thread.

    At most one reader waits, on a bare future (no Event, no queue): a step's delivery costs
    one `set_result` per request that has a reader waiting, and nothing for one that lags."""

    def __init__(self) -> None:
        self._pending: RequestOutput | None = None
        self._waiter: asyncio.Future[None] | None = None

    def put(self, output: RequestOutput) -> None:
        if self._pending is None:
            self._pending = output
        else:
            self._pending.merge(output)
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self) -> RequestOutput:
        if self._pending is None:
            assert self._waiter is None, "a mailbox has one reader"
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        output, self._pending = self._pending, None
        assert output is not None
        return output


class StreamOwner(Protocol):
    """What a stream tells the engine that admitted its request (AsyncEngine)."""

    def took(self, request_id: str, output: RequestOutput) -> None:
        """The reader took `output` (the in-flight counts move with it)."""

    def forget(self, request_id: str, abort: bool) -> None:
        """The stream is done; with abort, the request leaves the engine unfinished."""


class OutputStream:
    """The outputs of one admitted request, as an async iterator of deltas.

    Every exit path frees the request: when the last output arrives it is done; closing it
    early (aclose, a cancelled read, or dropping it unread) aborts it in the engine.
    """

    def __init__(self, engine: StreamOwner, request_id: str, mailbox: Mailbox) -> None:
        self.request_id = request_id
        self._engine: StreamOwner | None = engine
        self._mailbox = mailbox

    def __aiter__(self) -> OutputStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self._engine is None:
            raise StopAsyncIteration
        try:
            output = await self._mailbox.get()
        except BaseException:  # cancelled: the reader is gone
            self.close()
            raise
        if self._engine is not None:
            self._engine.took(self.request_id, output)
        if output.finished:
            self._release(abort=False)
        return output

    async def aclose(self) -> None:
        self.close()

    def close(self) -> None:
        self._release(abort=True)

    def _release(self, abort: bool) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            engine.forget(self.request_id, abort)

    def __del__(self) -> None:
        self.close()  # a stream dropped unread must not leave its request running
