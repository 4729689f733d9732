"""stream_outputs over one engine stream (the per-token path of every streamed response): the
stream is read directly, a finished one is never aborted, one closed early is aborted once."""

from __future__ import annotations

import asyncio

from pagedserve.core.outputs import CompletionOutput, RequestOutput
from pagedserve.openai_compat.common.metrics import ServerMetrics
from pagedserve.openai_compat.common.serving import stream_outputs


class ScriptedStream:
    """A RequestStream of `num` one-token deltas, the last one finished."""

    def __init__(self, num: int) -> None:
        self.left = num
        self.closed = 0

    def __aiter__(self) -> ScriptedStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.left == 0:
            raise StopAsyncIteration
        self.left -= 1
        await asyncio.sleep(0)
        reason = "length" if self.left == 0 else None
        return RequestOutput("r", [1], [CompletionOutput(0, "x", [7], None, reason)], not self.left)

    def close(self) -> None:
        self.closed += 1


def test_one_stream_read_to_the_end_is_not_aborted() -> None:
    stream = ScriptedStream(3)

    async def read() -> list[tuple[int, bool]]:
        return [
            (i, out.finished)
            async for i, out in stream_outputs([stream], ServerMetrics("m", lambda: None))
        ]

    assert asyncio.run(read()) == [(0, False), (0, False), (0, True)]
    assert stream.closed == 0


def test_one_stream_closed_early_is_aborted_once() -> None:
    stream = ScriptedStream(5)

    async def read_one() -> None:
        outputs = stream_outputs([stream], ServerMetrics("m", lambda: None))
        await outputs.__anext__()
        await outputs.aclose()  # type: ignore[attr-defined]  # the client went away

    asyncio.run(read_one())
    assert stream.closed == 1 and stream.left == 4
