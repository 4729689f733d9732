"""Stored responses for /v1/responses: `store`, `previous_response_id`, GET / DELETE / cancel.

A bounded in-memory map, per process (a restart forgets everything; replicas behind a load
balancer do not share it): at most `max_entries` responses and `max_bytes` of their JSON, each
kept `ttl_s` seconds after it was last written; beyond either bound the least recently used
entry goes first. An entry holds its response object, its own input items and the whole
conversation up to and including its output (what `previous_response_id` continues), which
shares the earlier entries' item objects rather than copying them; `max_bytes` bounds the JSON
each entry references, shared items counted in every entry that holds them.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson


@dataclass
class StoredResponse:
    response: dict[str, Any]
    """The Response object as GET returns it (updated in place while it runs)."""
    input_items: list[dict[str, Any]]
    """This request's own input items, each with an id (GET .../input_items)."""
    conversation: list[dict[str, Any]] = field(default_factory=list)
    """Every item so far: the previous response's conversation, this input, this output."""
    size: int = 0
    expires_at: float = 0.0


class ResponseStore:
    def __init__(
        self,
        max_entries: int,
        max_bytes: int,
        ttl_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self._clock = clock
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self.num_bytes = 0
        self.num_evicted = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, response_id: str) -> StoredResponse | None:
        entry = self._entries.get(response_id)
        if entry is None:
            return None
        if entry.expires_at <= self._clock():
            self._remove(response_id)
            return None
        self._entries.move_to_end(response_id)
        return entry

    def put(self, response_id: str, entry: StoredResponse) -> None:
        """Add or replace; the entry's size is measured here, and it is kept only if it fits."""
        if response_id in self._entries:
            self._remove(response_id)
        entry.size = _size(entry)
        if self.max_entries < 1 or entry.size > self.max_bytes:
            return
        entry.expires_at = self._clock() + self.ttl_s
        self._entries[response_id] = entry
        self.num_bytes += entry.size
        self._evict()

    def update(self, response_id: str, entry: StoredResponse) -> None:
        """put, but only while the id is still stored (a deleted or evicted entry stays gone)."""
        if response_id in self._entries:
            self.put(response_id, entry)

    def delete(self, response_id: str) -> bool:
        if self.get(response_id) is None:
            return False
        self._remove(response_id)
        return True

    def _remove(self, response_id: str) -> None:
        entry = self._entries.pop(response_id)
        self.num_bytes -= entry.size

    def _evict(self) -> None:
        now = self._clock()
        expired = [key for key, e in self._entries.items() if e.expires_at <= now]
        for key in expired:
            self._remove(key)
        while len(self._entries) > self.max_entries or self.num_bytes > self.max_bytes:
            oldest = next(iter(self._entries))
            self._remove(oldest)
            self.num_evicted += 1


def _size(entry: StoredResponse) -> int:
    """Bytes of the JSON the entry references: its response and its whole conversation (which
    holds its input). Items shared along a chain count once per entry, so the bound holds
    even after the earlier entries are evicted."""
    return len(orjson.dumps(entry.response)) + len(orjson.dumps(entry.conversation))
