"""Rank 0's side of tensor parallelism: start the workers, join them, watch them, stop them.

    tp = TensorParallel.start(spec)     # spawns this node's other ranks, joins the group
    ... load_model(..., group=tp.group); share_num_pages(tp.group, n)
    with tp.stepping(): ...             # one step's collectives (a failure here is fatal)
    tp.set_lora(slot, adapter)          # the LoRA registry's mirror: every worker writes its
    tp.clear_lora(slot)                 # share of the slot (or clears it), between steps
    tp.watch(callback)                  # callback(reason) when a worker process exits
    tp.close()                          # stop, join, terminate what is left

Workers are `spawn`ed (a fork after OpenMP or CUDA initialization hangs or breaks), daemonic (the
interpreter's exit terminates them) and each watches its parent (a killed server takes them
along). A watchdog thread waits on their process sentinels: a worker that exits while the
engine runs is a fault, reported at once, so that an idle server turns dead (/health 503)
without waiting for a step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import multiprocessing
import threading
from collections.abc import Callable, Iterator
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess

import torch

from pagedserve.core.config import EngineConfig, ParallelConfig
from pagedserve.core.distributed.group import TPGroup, open_group, open_store, rank_device
from pagedserve.core.distributed.step import StepChannel
from pagedserve.core.executor.worker import WorkerSpec, threads_per_rank, worker_main
from pagedserve.core.lora.peft import AdapterWeights
from pagedserve.core.models.registry import read_arch
from pagedserve.core.models.resolve import ResolvedModel
from pagedserve.core.models.tensor_parallel import check_divisible

logger = logging.getLogger(__name__)

JOIN_SECONDS = 10.0
"""How long close() waits for workers to leave by themselves before terminating them."""


def spawn_workers(spec: WorkerSpec, ranks: range) -> list[BaseProcess]:
    context = multiprocessing.get_context("spawn")
    processes: list[BaseProcess] = []
    for rank in ranks:
        process = context.Process(
            target=worker_main, args=(spec, rank), name=f"pagedserve-tp-rank{rank}", daemon=True
        )
        process.start()
        processes.append(process)
    return processes


def stop_processes(processes: list[BaseProcess], grace: float = JOIN_SECONDS) -> None:
    """Join each process for up to `grace` seconds in all, then terminate, then kill."""
    for process in processes:
        process.join(grace)
    for process in processes:
        if process.is_alive():
            process.terminate()
            process.join(2.0)
        if process.is_alive():
            process.kill()
            process.join()


class TensorParallel:
    def __init__(self, group: TPGroup, processes: list[BaseProcess]) -> None:
        self.group = group
        self.channel = StepChannel(group)
        self.processes = processes
        self.fault: str | None = None
        """Why the ranks can no longer step together (a worker died, a collective failed)."""
        self._callbacks: list[Callable[[str], None]] = []
        self._step_lock = threading.Lock()
        self._closing = False
        self._wake_r, self._wake_w = multiprocessing.Pipe(duplex=False)
        self._watchdog = threading.Thread(
            target=self._watch, name="pagedserve-tp-watch", daemon=True
        )
        self._watchdog.start()

    @classmethod
    def start(cls, spec: WorkerSpec) -> TensorParallel:
        """Rank 0 on node 0: open the store, spawn this node's workers, join the group."""
        parallel = spec.parallel
        store = open_store(parallel, 0)
        spec = dataclasses.replace(spec, parallel=_with_port(parallel, store.port))
        processes = spawn_workers(spec, parallel.node_ranks()[1:])
        try:
            if spec.device.type == "cpu":
                torch.set_num_threads(threads_per_rank(parallel))
            group = open_group(spec.parallel, 0, rank_device(spec.device, 0), store)
        except BaseException:
            stop_processes(processes, grace=0.0)
            raise
        return cls(group, processes)

    def watch(self, callback: Callable[[str], None]) -> None:
        """Call callback(reason) (on the watchdog thread) when the ranks fail; at once if
        they already have."""
        self._callbacks.append(callback)
        if self.fault is not None:
            callback(self.fault)

    def report(self, reason: str) -> None:
        """Record a fault (the first one wins) and tell the watchers."""
        if self.fault is not None or self._closing:
            return
        self.fault = reason
        logger.error("tensor parallel: %s", reason)
        for callback in self._callbacks:
            callback(reason)

    @contextlib.contextmanager
    def stepping(self) -> Iterator[None]:
        """One step's collectives: any exception inside leaves the ranks out of step, so it is
        a fault (the engine then reports itself dead)."""
        if self.fault is not None:
            raise RuntimeError(f"tensor parallel: {self.fault}")
        with self._step_lock:
            try:
                yield
            except Exception as exc:
                self.report(f"a step's collective failed: {exc}")
                raise

    def set_lora(self, slot: int, adapter: AdapterWeights, num_slots: int, max_rank: int) -> None:
        """Every worker writes its share of the (checked) adapter into `slot` (of stacks of
        num_slots slots of rank <= max_rank, rank 0's)."""
        with self.stepping():
            self.channel.send_lora(slot, adapter, num_slots, max_rank)

    def clear_lora(self, slot: int) -> None:
        with self.stepping():
            self.channel.clear_lora(slot)

    def _watch(self) -> None:
        sentinels = {p.sentinel: p for p in self.processes}
        ready = wait([*sentinels, self._wake_r])
        for sentinel in ready:
            process = sentinels.get(sentinel) if isinstance(sentinel, int) else None
            if process is not None:
                process.join()
                self.report(f"worker {process.name} (pid {process.pid}) exited with code "
                            f"{process.exitcode}")  # fmt: skip

    def close(self, polite: bool = True) -> None:
        """Stop the workers (with a stop message when polite and no step is running; else
        terminated), then leave the group."""
        if self._closing:
            return
        self._closing = True
        self._wake_w.send(None)
        polite = polite and self.fault is None
        if polite and self._step_lock.acquire(timeout=1.0):
            try:
                self.channel.stop()
            except Exception:  # a worker already gone: terminate the rest below
                logger.warning("tensor parallel: the stop message did not reach every worker")
            finally:
                self._step_lock.release()
        stop_processes(self.processes, grace=JOIN_SECONDS if polite else 0.0)
        self._watchdog.join(5.0)
        self.group.close()


def _with_port(parallel: ParallelConfig, port: int) -> ParallelConfig:
    return dataclasses.replace(parallel, master_port=port)


def start_tensor_parallel(
    config: EngineConfig, resolved: ResolvedModel, dtype: torch.dtype, device: torch.device
) -> TensorParallel | None:
    """At tensor_parallel_size > 1, check the model divides, then start this node's workers and
    join every rank (rank 0 is this process); None at 1."""
    parallel = config.parallel
    if parallel.tensor_parallel_size == 1:
        return None
    if parallel.node_rank != 0:
        raise ValueError("node_rank: only node 0 runs the engine (other nodes run workers)")
    check_divisible(read_arch(resolved), parallel.tensor_parallel_size)
    spec = WorkerSpec(
        resolved=resolved,
        dtype=dtype,
        device=device,
        config=config,
        parallel=parallel,
    )
    return TensorParallel.start(spec)
