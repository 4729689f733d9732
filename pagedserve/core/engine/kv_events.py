"""KV events for prefix-aware routers (llm-d, NVIDIA Dynamo), on vLLM's wire format.

The page allocator logs each page hash that enters or leaves its prefix cache, with the salt
its chain was seeded with (native); the engine drains the log once per step into one batch
(the records become events in one pass, each stored page named by its salt's adapter), and a
publisher thread, the only owner of the ZeroMQ sockets, sends it, so a step never waits on
the network.

The wire (vLLM's `--kv-events-config` publisher, msgpack arrays as msgspec's array_like
structs encode them: vLLM's positional form, which routers that also read its newer named-field
form still decode):
- PUB, one message per batch: [topic, sequence number (8 bytes, big-endian), payload];
- payload: [ts, [event, ...], data_parallel_rank] with events
  ["BlockStored", block_hashes, parent_block_hash | nil, token_ids, block_size, lora_id | nil,
  medium, lora_name | nil], ["BlockRemoved", block_hashes, medium], ["AllBlocksCleared"];
  one BlockStored carries a chain of pages (each page's parent is the one before it) of one
  adapter: lora_id is its `LoRARequest.lora_int_id` (the salt of its pages' hashes: the cache
  never shares pages across adapters), lora_name its name, both nil for the base model;
- ROUTER (replay): a request [identity, "", start (8 bytes, big-endian)] is answered with
  [identity, "", seq, payload] for every kept batch from start on, then [identity, "", -1, ""].
Sequence number 0 is an AllBlocksCleared: whatever a subscriber held for this replica is gone.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from typing import Any

from pagedserve.core.config import EngineConfig, KVEventsConfig, binds
from pagedserve.core.sched.scheduler import KvEventRecords, Scheduler

logger = logging.getLogger(__name__)

END_OF_REPLAY = (-1).to_bytes(8, "big", signed=True)
_POLL_S = 0.05  # how long the thread waits for a batch before it looks at replay requests
_CLOSE_LINGER_MS = 500  # at shutdown, how long the last batches may take to leave


class PageAdapters:
    """The names of the adapters requests have run with, so BlockStored names a page's adapter
    (vLLM's lora_id and lora_name; None for the base). The adapter of each page is the salt
    its hash chain was seeded with, which the allocator's log records; this adds the name. The
    engine thread's: a request's adapter is noted when it is added."""

    def __init__(self) -> None:
        self.names: dict[int, str] = {}
        """Adapter id (the cache salt) -> name, for every adapter a request has run with."""

    def note(self, lora_int_id: int, lora_name: str) -> None:
        self.names[lora_int_id] = lora_name

    def lora(self, salt: int) -> tuple[int | None, str | None]:
        """(lora_id, lora_name) of a salt: (None, None) for the base (0)."""
        if not salt:
            return None, None
        return salt, self.names.get(salt)


def to_events(
    records: KvEventRecords, page_size: int, medium: str, adapters: PageAdapters | None = None
) -> list[list[Any]]:
    """The records as vLLM's events: runs of removals in one BlockRemoved, chains of stores
    (each page the child of the one before, of one adapter) in one BlockStored."""
    adapters = adapters if adapters is not None else PageAdapters()
    events: list[list[Any]] = []
    kinds, hashes = records.kinds.tolist(), records.hashes.tolist()
    parents, has_parent = records.parent_hashes.tolist(), records.has_parent.tolist()
    salts, tokens = records.salts.tolist(), records.token_ids.tolist()
    stored = 0  # index into tokens: stored records carry a row each
    for i, kind in enumerate(kinds):
        last = events[-1] if events else None
        if kind == KvEventRecords.REMOVED:
            if last is not None and last[0] == "BlockRemoved":
                last[1].append(hashes[i])
            else:
                events.append(["BlockRemoved", [hashes[i]], medium])
            continue
        parent = parents[i] if has_parent[i] else None
        row = tokens[stored]
        stored += 1
        lora_id, lora_name = adapters.lora(salts[i])
        if (last is not None and last[0] == "BlockStored" and parent == last[1][-1]
                and last[5] == lora_id):  # fmt: skip
            last[1].append(hashes[i])
            last[3].extend(row)
        else:
            events.append(
                ["BlockStored", [hashes[i]], parent, row, page_size, lora_id, medium, lora_name]
            )
    return events


class KvEventPublisher:
    """vLLM's ZMQ publisher: a thread owns the PUB (and replay ROUTER) sockets and a ring of
    the last `buffer_steps` batches; `publish` only queues."""

    def __init__(self, config: KVEventsConfig, page_size: int, medium: str) -> None:
        import zmq  # only a server that publishes needs it

        self._zmq = zmq
        self.config = config
        self.page_size = page_size
        self.medium = medium
        self.adapters = PageAdapters()
        """Each cached page's adapter (the engine thread's; `note_adapter` as requests come)."""
        self._queue: queue.Queue[list[list[Any]] | None] = queue.Queue(config.max_queue_size)
        self._buffer: collections.deque[tuple[int, bytes]] = collections.deque(
            maxlen=config.buffer_steps
        )
        self._num_dropped = 0
        self.num_queued = 0
        """Batches accepted by publish() (the next one's sequence number)."""
        self.num_published = 0
        """Batches sent so far (the publisher thread's count)."""
        self.endpoint = config.endpoint
        """Where the PUB socket is (a bound wildcard port resolved)."""
        self.replay_endpoint = config.replay_endpoint
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="pagedserve-kv-events", daemon=True)
        self._thread.start()
        self._started.wait()
        if self._error is not None:
            raise ValueError(f"kv_events_config: {self._error}") from self._error
        self.publish([["AllBlocksCleared"]])

    def publish_records(self, records: KvEventRecords | None) -> None:
        """The engine thread, once per step: the step's records as one batch (none: nothing)."""
        if records is not None:
            self.publish(to_events(records, self.page_size, self.medium, self.adapters))

    def note_adapter(self, lora_int_id: int, lora_name: str) -> None:
        """The engine thread, as a request runs with an adapter: its pages will carry its id."""
        self.adapters.note(lora_int_id, lora_name)

    def publish(self, events: list[list[Any]]) -> None:
        try:
            self._queue.put_nowait(events)
            self.num_queued += 1
        except queue.Full:  # never blocks the engine; subscribers see the gap in seq numbers
            self._num_dropped += 1
            if self._num_dropped == 1:
                logger.error("KV events: the publisher is behind; dropping batches")

    def close(self) -> None:
        """Send what is queued, then close the sockets (the engine's close)."""
        self._queue.put(None)
        self._thread.join(timeout=5)

    # ---- the publisher thread -------------------------------------------------------------------

    def _run(self) -> None:
        zmq = self._zmq
        ctx = zmq.Context.instance()
        pub = ctx.socket(zmq.PUB)
        replay = ctx.socket(zmq.ROUTER) if self.config.replay_endpoint is not None else None
        try:
            pub.set_hwm(self.config.hwm)
            self.endpoint = _bind_or_connect(pub, self.config.endpoint, zmq)
            if replay is not None and self.config.replay_endpoint is not None:
                replay.bind(self.config.replay_endpoint)
                self.replay_endpoint = replay.getsockopt_string(zmq.LAST_ENDPOINT)
        except zmq.ZMQError as exc:
            self._error = exc
            _close(0, pub, replay)
            self._started.set()
            return
        self._started.set()
        try:
            self._serve(pub, replay)
        finally:
            _close(_CLOSE_LINGER_MS, pub, replay)

    def _serve(self, pub: Any, replay: Any | None) -> None:
        import msgpack

        topic = self.config.topic.encode()
        seq = 0
        while True:
            if replay is not None:
                while replay.poll(0):
                    self._replay(replay)
            try:
                events = self._queue.get(timeout=_POLL_S)
            except queue.Empty:
                continue
            if events is None:
                return
            payload = msgpack.packb([time.time(), events, 0])
            pub.send_multipart([topic, seq.to_bytes(8, "big"), payload])
            self._buffer.append((seq, payload))
            seq += 1
            self.num_published = seq

    def _replay(self, replay: Any) -> None:
        frames = replay.recv_multipart()
        if len(frames) != 3 or len(frames[2]) != 8:
            logger.warning("KV events: a malformed replay request (%d frames)", len(frames))
            return
        identity, start = frames[0], int.from_bytes(frames[2], "big")
        for seq, payload in list(self._buffer):
            if seq >= start:
                replay.send_multipart([identity, b"", seq.to_bytes(8, "big"), payload])
        replay.send_multipart([identity, b"", END_OF_REPLAY, b""])


def _bind_or_connect(sock: Any, endpoint: str, zmq: Any) -> str:
    """vLLM's rule (`config.binds`): bind a wildcard, ipc:// or inproc:// address, connect to
    any other."""
    if binds(endpoint):
        sock.bind(endpoint)
        return str(sock.getsockopt_string(zmq.LAST_ENDPOINT))
    sock.connect(endpoint)
    return endpoint


def _close(linger_ms: int, *sockets: Any) -> None:
    for sock in sockets:
        if sock is not None:
            sock.close(linger=linger_ms)


def start_kv_events(
    config: EngineConfig, scheduler: Scheduler, device: str, model_name: str
) -> KvEventPublisher | None:
    """The publisher of the prefix cache's changes, when --kv-events-config turns it on (the
    scheduler's allocator then logs them); None when off. `{model}` still in the topic (a
    single-model server's without --served-model-name) becomes `model_name`."""
    if not config.kv_events.enabled:
        return None
    scheduler.enable_kv_events()
    medium = "GPU" if device.startswith("cuda") else "CPU"
    events = config.kv_events.with_model(model_name)
    publisher = KvEventPublisher(events, config.cache.page_size, medium)
    replay = f"; replay at {publisher.replay_endpoint}" if publisher.replay_endpoint else ""
    logger.info("KV events of %s: %s %s, topic %r%s", model_name,
                "bound at" if binds(events.endpoint) else "sent to", publisher.endpoint,
                events.topic, replay)  # fmt: skip
    return publisher
