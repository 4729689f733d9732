"""Streamed responses: Server-Sent Events, and aborting work when the client goes away.

Every exit path of a stream (done, error, client gone) closes the chunk iterator; the serving
layer's iterators close the engine generators in `finally`, and those abort the request, which
frees its KV pages.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Mapping
from typing import Any, TypeVar

import orjson
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from pagedserve.openai_compat.common.errors import APIError, internal

logger = logging.getLogger("pagedserve.server")

T = TypeVar("T")
DONE_FRAME = b"data: [DONE]\n\n"
_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse_frame(payload: Any) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


async def sse_frames(
    chunks: AsyncIterator[dict[str, Any]], request_id: str, done: bool = True
) -> AsyncIterator[bytes]:
    """Chunks as SSE frames; a failure after the headers went out becomes an error frame.
    done: end with `data: [DONE]` (OpenAI's streams; llama.cpp's own endpoints send none)."""
    try:
        async for chunk in chunks:
            yield sse_frame(chunk)
    except APIError as exc:
        yield sse_frame(exc.body())
    except Exception:
        logger.exception("request %s failed while streaming", request_id)
        yield sse_frame(internal(request_id).body())
    finally:
        await chunks.aclose()  # type: ignore[attr-defined]
    if done:
        yield DONE_FRAME


class SSEResponse(Response):
    """text/event-stream that stops and closes its frame iterator when the client disconnects."""

    media_type = "text/event-stream"

    def __init__(self, frames: AsyncIterator[bytes], headers: Mapping[str, str] | None = None):
        self.frames = frames
        self.status_code = 200
        self.background = None
        self.init_headers({**_SSE_HEADERS, **(headers or {})})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await until_disconnect(receive, self._send_frames(send))
        except ClientGone:
            logger.info("client disconnected mid-stream")
        finally:
            await self.frames.aclose()  # type: ignore[attr-defined]

    async def _send_frames(self, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        async for frame in self.frames:
            await send({"type": "http.response.body", "body": frame, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class ClientGone(Exception):
    """The client disconnected before the response was complete."""


async def until_disconnect(receive: Receive, work: Awaitable[T]) -> T:
    """Await `work`, cancelling it (which aborts its engine requests) if the client leaves."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_disconnect(receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    if task.cancelled():
        raise ClientGone()
    return task.result()
