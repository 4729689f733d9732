"""The outputs in flight, as the event loop sees them: what /metrics' running + waiting count.

An output is in flight from its request's admission (`generate()` / `embed()` returned) until
its reader took its last delta, or the stream was closed. The engine thread's own counts come
from a snapshot taken after each step, so they lag: a request admitted a moment ago, an n > 1
sibling not yet added, or one whose last delta is still on its way would count nowhere. Here
running + waiting is this count by construction, whatever the snapshot says; the snapshot only
splits it (running: at most what the engine ran last).
"""

from __future__ import annotations

import dataclasses

from pagedserve.core.outputs import EngineStats, RequestOutput


class InFlight:
    """Outputs admitted and not yet ended, per request; touched only on the event loop."""

    def __init__(self) -> None:
        self._remaining: dict[str, int] = {}
        self.total = 0

    def add(self, request_id: str, num_outputs: int) -> None:
        self._remaining[request_id] = num_outputs
        self.total += num_outputs

    def took(self, request_id: str, output: RequestOutput) -> None:
        """The reader took `output`: each output it ends leaves the count."""
        ended = sum(1 for o in output.outputs if o.finish_reason is not None)
        remaining = self._remaining.get(request_id)
        if remaining is None or not ended:
            return
        ended = min(ended, remaining)
        self._remaining[request_id] = remaining - ended
        self.total -= ended

    def forget(self, request_id: str) -> None:
        """The request's stream is done or closed (aborted): whatever is left leaves."""
        self.total -= self._remaining.pop(request_id, 0)

    def split(self, snapshot: EngineStats) -> EngineStats:
        """`snapshot` with running + waiting == the outputs in flight."""
        running = min(snapshot.num_running, self.total)
        waiting = self.total - running
        if running == snapshot.num_running and waiting == snapshot.num_waiting:
            return snapshot
        return dataclasses.replace(snapshot, num_running=running, num_waiting=waiting)
