"""The models a server offers and the engines of those loaded (issue 39).

A request's `model` names an entry; `ModelPool.use` holds it (a lease) while the request runs,
loading its engine first when it is not loaded (in a worker thread: the other models keep
serving, the request waits). Loading makes room first: the least recently used idle model is
evicted while `max_loaded` or the memory budget would be exceeded; when no model is idle the load
waits for one to become idle, so a request in flight is never cut. `idle_unload` frees a model
(weights and KV) that has served nothing for that long.

A model is idle when nothing holds it: no lease (a request between its arrival and its engine
call) and no engine stream open (`CountingEngine` counts them, background responses included).
The single-model server is the pool of one, loaded at start-up (`preload`): a request that comes
while that first load runs is answered 503, as /health is.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import logging
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any, Generic, Literal, TypeVar

from pagedserve.core.engine_client import EngineClient
from pagedserve.openai_compat.common import errors
from pagedserve.openai_compat.model_lease import CountingEngine

logger = logging.getLogger("pagedserve.server")
T = TypeVar("T")
S = TypeVar("S")

ModelStatus = Literal["unloaded", "loading", "loaded", "failed"]
"""What /v1/models and /health say of a model (llama.cpp's router says the same words)."""


@dataclass(frozen=True)
class ModelSpec:
    """One model the server offers."""

    name: str
    """What requests send as `model` ("" for the single-model server: named once loaded)."""
    load: Callable[[], EngineClient]
    """Builds the engine (blocking; run in a worker thread)."""
    path: str = ""
    """Where it loads from (shown by /v1/models)."""
    memory_bytes: int = 0
    """Its estimated memory once loaded (weights files + KV budget), for the memory budget."""
    preload: bool = False
    """Loaded at start-up; requests are refused (503) until that load ends."""


@dataclass(frozen=True)
class ModelState:
    name: str
    path: str
    status: ModelStatus
    error: str = ""
    """Why its last load failed."""


@dataclass(frozen=True)
class PoolLimits:
    max_loaded: int = 0
    """Most models loaded at once (0: no limit)."""
    memory_bytes: int = 0
    """Most estimated memory of the loaded models together (0: no limit)."""
    idle_unload: float = 0.0
    """Seconds an idle model stays loaded (0: until evicted)."""


class _Entry(Generic[S]):
    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self.name = spec.name
        self.status: ModelStatus = "unloaded"
        self.engine: EngineClient | None = None
        """The engine as loaded (the services hold its CountingEngine)."""
        self.services: S | None = None
        self.in_flight = 0
        self.last_used = time.monotonic()
        self.error = ""
        self.loading: asyncio.Future[S] | None = None
        self.reserved = False
        """Room is made for it (it counts against the limits while it loads)."""
        self.unloading: asyncio.Task[None] | None = None
        self.preloading = False
        self.num_loads = 0

    @property
    def holds_room(self) -> bool:
        return self.status == "loaded" or (self.status == "loading" and self.reserved)


class ModelPool(Generic[S]):
    """Entries by name; `build` turns a loaded engine into what routes use (S), `drop` is told
    when a model's services go away."""

    def __init__(
        self,
        specs: Sequence[ModelSpec],
        limits: PoolLimits,
        catalog: bool,
        build: Callable[[str, EngineClient], S],
        drop: Callable[[str, S], None],
        accepts: Callable[[S, str], bool],
        on_loaded: Callable[[EngineClient], None] | None = None,
        on_fatal: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.entries = [_Entry[S](spec) for spec in specs]
        self.limits = limits
        self.catalog = catalog
        """Models are chosen by name (--models-dir / --models-config); else the one model is
        every request's, and its serving context checks the name."""
        self._build, self._drop, self._accepts = build, drop, accepts
        self._on_loaded, self._on_fatal = on_loaded, on_fatal
        self._changed = asyncio.Event()
        self._watcher: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # ---- start and stop ---------------------------------------------------------------------

    def start(self) -> None:
        """Start the preloads and the idle watcher (on the running loop)."""
        for entry in self.entries:
            if entry.spec.preload:
                entry.preloading = True
                entry.loading = asyncio.ensure_future(self._load(entry))
                entry.loading.add_done_callback(partial(self._preloaded, entry))
        if self.limits.idle_unload > 0:
            self._watcher = asyncio.ensure_future(self._watch_idle())

    def _preloaded(self, entry: _Entry[S], future: asyncio.Future[S]) -> None:
        entry.preloading = False
        exc = None if future.cancelled() else future.exception()
        if exc is not None and self._on_fatal is not None and not self.catalog:
            self._on_fatal(exc)

    async def close(self) -> None:
        """Stop the watcher and every engine (after the server drained its requests)."""
        if self._watcher is not None:
            self._watcher.cancel()
        for entry in self.entries:
            if entry.loading is not None and not entry.loading.done():
                entry.loading.cancel()  # the loading thread cannot be stopped; it dies with us
            if entry.engine is not None:  # the process ends: no heap to hand back
                self._unload(entry, "the server stops", reclaim=False)
        await asyncio.gather(*(e.unloading for e in self.entries if e.unloading is not None))

    # ---- what routes ask --------------------------------------------------------------------

    @asynccontextmanager
    async def use(self, model: str | None) -> AsyncIterator[S]:
        """The services of the model a request names, loaded if need be; the model is held
        (never evicted) until the block ends and the engine streams it opened are closed."""
        self._loop = asyncio.get_running_loop()
        entry = self._entry_for(model)
        entry.in_flight += 1
        try:
            yield await self._ready(entry)
        finally:
            self._release(entry)

    def loaded(self) -> list[tuple[str, S]]:
        """The loaded models' names and services."""
        return [(e.name, e.services) for e in self.entries if e.services is not None]

    def first_engine(self) -> EngineClient | None:
        return next((e.engine for e in self.entries if e.engine is not None), None)

    def states(self) -> list[ModelState]:
        """Every model's, in the catalog's order."""
        return [ModelState(e.name, e.spec.path, self._status(e), e.error) for e in self.entries]

    def starting(self) -> bool:
        """A start-up load is still running (or the single-model server's failed: it exits)."""
        first = self.entries[0]
        failed = not self.catalog and first.status == "failed" and not first.num_loads
        return failed or any(e.preloading for e in self.entries)

    def _status(self, entry: _Entry[S]) -> ModelStatus:
        if entry.engine is not None and entry.engine.errored:
            return "failed"
        return entry.status

    def _entry_for(self, model: str | None) -> _Entry[S]:
        if not self.catalog:
            return self.entries[0]
        if not model:
            if len(self.entries) == 1:
                return self.entries[0]
            raise errors.invalid("`model` is required: this server offers several.", "model")
        for entry in self.entries:
            if entry.name == model:
                return entry
        for entry in self.entries:  # a name a loaded model answers to, e.g. one of its adapters
            if entry.services is not None and self._accepts(entry.services, model):
                return entry
        raise errors.model_not_found(model)

    async def _ready(self, entry: _Entry[S]) -> S:
        engine = entry.engine
        if self.catalog and engine is not None and engine.errored:
            self._unload(entry, "its engine stopped after a fault")  # loaded again, afresh
        if entry.services is not None:
            entry.last_used = time.monotonic()
            return entry.services
        if entry.preloading:
            raise errors.unavailable("The model is still loading.")
        if entry.loading is None:
            entry.loading = asyncio.ensure_future(self._load(entry))
        # shielded: one request leaving does not cancel the load the others wait for
        return await asyncio.shield(entry.loading)

    def _release(self, entry: _Entry[S]) -> None:
        if self._loop is not None and _running_loop() is not self._loop:
            # a stream dropped unread on another thread (garbage collection): count it here
            self._loop.call_soon_threadsafe(self._release, entry)
            return
        entry.in_flight -= 1
        entry.last_used = time.monotonic()
        if entry.in_flight == 0:
            self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    # ---- loading, eviction, idle unloading -------------------------------------------------

    async def _load(self, entry: _Entry[S]) -> S:
        entry.status, entry.reserved, entry.error = "loading", False, ""
        try:
            await self._make_room(entry)
            if entry.unloading is not None:
                await entry.unloading  # its previous engine is gone before the next one loads
            started = time.monotonic()
            engine = await in_daemon_thread(entry.spec.load)
        except Exception as exc:
            entry.status, entry.error = "failed", f"{type(exc).__name__}: {exc}"
            logger.exception("loading model %s failed", entry.name or entry.spec.path)
            raise errors.invalid(
                f"The model '{entry.name}' failed to load ({entry.error}).", "model",
                "model_load_failed",
            ) from exc  # fmt: skip
        finally:
            entry.loading, entry.reserved = None, False
            self._notify()
        entry.name = entry.name or engine.model_info.name
        counting = CountingEngine(engine, partial(self._hold, entry), partial(self._release, entry))
        entry.engine, entry.services = engine, self._build(entry.name, counting)
        entry.status, entry.last_used = "loaded", time.monotonic()
        entry.num_loads += 1
        logger.info("model %s loaded in %.1f s", entry.name, time.monotonic() - started)
        if self._on_loaded is not None:
            self._on_loaded(engine)
        return entry.services

    def _hold(self, entry: _Entry[S]) -> None:
        entry.in_flight += 1

    async def _make_room(self, entry: _Entry[S]) -> None:
        """Evict idle models, least recently used first, until `entry` fits the limits; wait
        while it does not and no model is idle."""
        while True:
            changed = self._changed
            victims = self._victims(entry)
            if victims is not None:
                for victim in victims:
                    self._unload(victim, "room for " + (entry.name or entry.spec.path))
                entry.reserved = True
                await asyncio.gather(*(v.unloading for v in victims if v.unloading is not None))
                return
            logger.info("model %s waits for a loaded model to become idle", entry.name)
            await changed.wait()

    def _victims(self, entry: _Entry[S]) -> list[_Entry[S]] | None:
        """The idle models to evict so that `entry` fits (LRU first); None: it cannot fit now."""
        held = [e for e in self.entries if e.holds_room and e is not entry]
        idle = sorted((e for e in held if e.status == "loaded" and e.in_flight == 0),
                      key=lambda e: e.last_used)  # fmt: skip
        victims: list[_Entry[S]] = []
        while not self._fits(entry, [e for e in held if e not in victims]):
            if not idle:
                return None if any(e not in victims for e in held) else victims
            victims.append(idle.pop(0))
        return victims

    def _fits(self, entry: _Entry[S], held: list[_Entry[S]]) -> bool:
        limits = self.limits
        if limits.max_loaded and len(held) + 1 > limits.max_loaded:
            return False
        memory = sum(e.spec.memory_bytes for e in held) + entry.spec.memory_bytes
        return not limits.memory_bytes or memory <= limits.memory_bytes

    def _unload(self, entry: _Entry[S], why: str, reclaim: bool = True) -> None:
        """Forget the model's engine now (new requests load it again) and stop it; `reclaim`
        then collects its memory and hands it back to the system (a full gc.collect: ~0.2-1 s
        in a large process, worth it only when the process goes on)."""
        engine, services = entry.engine, entry.services
        entry.engine, entry.services, entry.status = None, None, "unloaded"
        if services is not None:
            self._drop(entry.name, services)
        self._notify()  # a load waiting for room may go on
        if engine is not None:
            logger.info("unloading model %s (%s)", entry.name, why)
            entry.unloading = asyncio.ensure_future(_stop(engine, reclaim))
            entry.unloading.add_done_callback(partial(_forget_unloading, entry))

    async def _watch_idle(self) -> None:
        period = min(self.limits.idle_unload / 4, 5.0)
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            for entry in self.entries:
                idle_for = now - entry.last_used
                if entry.status == "loaded" and entry.in_flight == 0 \
                        and idle_for >= self.limits.idle_unload:  # fmt: skip
                    self._unload(entry, f"idle for {idle_for:.0f} s")


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _forget_unloading(entry: _Entry[Any], task: asyncio.Task[None]) -> None:
    if entry.unloading is task:
        entry.unloading = None


async def _stop(engine: EngineClient, reclaim: bool) -> None:
    try:
        await engine.shutdown()
    except Exception:
        logger.exception("stopping an engine failed")
    del engine
    if not reclaim:
        return
    gc.collect()  # the model's tensors, held in reference cycles of the runner, go now
    _trim_heap()


def _trim_heap() -> None:
    """Hand freed heap pages back to the system (glibc keeps them otherwise), so that an
    unloaded model's memory leaves the process's RSS."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


async def in_daemon_thread(fn: Callable[[], T]) -> T:
    """Like asyncio.to_thread, but a daemon thread: SIGTERM while a model loads does not wait
    for the load to finish before the process exits."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(run: Callable[[], None]) -> None:
        if not future.done():
            run()

    def run() -> None:
        try:
            result = fn()
        except BaseException as exc:  # handed to the awaiting coroutine
            outcome = partial(future.set_exception, exc)
        else:
            outcome = partial(future.set_result, result)
        if not loop.is_closed():
            loop.call_soon_threadsafe(settle, outcome)

    threading.Thread(target=run, name="pagedserve-load", daemon=True).start()
    return await future
