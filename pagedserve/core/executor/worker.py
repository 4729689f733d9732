"""A tensor-parallel worker: one rank other than 0, in its own process (started by `spawn`).

It joins the group, loads its shard of the model, allocates its heads' paged KV cache (as many
pages as rank 0 says, so the page tables mean the same everywhere), then runs what rank 0
broadcasts, step after step, until rank 0 says stop. It never samples: its share of the logits
goes to rank 0. Under --enable-lora it holds its share of every adapter slot (the model's
enable_lora) and writes or clears a slot when rank 0 says so, between steps (rank 0 has read and
checked the adapter: a worker never reads an adapter's file). It exits when its parent process
does (a killed server leaves no worker behind), and a peer that vanishes mid-step makes its
collective fail, which ends it.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
from dataclasses import dataclass

import torch

from pagedserve.core.attention.base import kv_cache_dtype, kv_cache_shape
from pagedserve.core.config import EngineConfig, LoRAConfig, ParallelConfig
from pagedserve.core.device_policy import load_for_engine
from pagedserve.core.distributed.group import TPGroup, open_group, open_store, rank_device
from pagedserve.core.distributed.step import LoraCommand, StepChannel, StepInputs
from pagedserve.core.lora.registry import LoraTarget, clear_adapter, write_adapter
from pagedserve.core.models.base import CausalLM
from pagedserve.core.models.resolve import ResolvedModel

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerSpec:
    """What a rank needs to build its part of the engine (pickled once, at spawn)."""

    resolved: ResolvedModel
    dtype: torch.dtype
    device: torch.device
    """cpu or cuda (a CUDA rank takes the GPU of its index on its node)."""
    config: EngineConfig
    """The engine's: each rank loads and packs as rank 0 does (device_policy.load_for_engine)."""
    parallel: ParallelConfig
    """With the master port rank 0's store actually listens on."""


def threads_per_rank(parallel: ParallelConfig) -> int:
    """CPU threads for each rank of this node: the cores this process may use, shared."""
    return max(1, len(os.sched_getaffinity(0)) // parallel.ranks_per_node)


def exit_with_parent() -> None:
    """End this process as soon as the process that started it is gone (any way it went)."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        parent.join()
        os._exit(1)

    threading.Thread(target=watch, name="pagedserve-parent-watch", daemon=True).start()


def run_step(
    model: CausalLM, kv_caches: list[torch.Tensor], inputs: StepInputs, dtype: torch.dtype
) -> None:
    """Rank 0's forward pass, collective for collective (models/tensor_parallel.py), the
    step's adapter rows grouped as rank 0 groups them."""
    lora = inputs.lora_batch(dtype)
    hidden = model(inputs.input_ids, inputs.positions, kv_caches, inputs.meta, lora)
    model.compute_logits(hidden[inputs.sample_rows])
    for start, count in inputs.prompt_rows:
        if count:
            model.compute_logits(hidden[start : start + count])


def share_num_pages(group: TPGroup, num_pages: int = 0) -> int:
    """Rank 0's KV page count, on every rank (workers pass nothing and wait for it)."""
    return int(group.broadcast_control(torch.tensor([num_pages], dtype=torch.int64)).item())


class WorkerLora:
    """This rank's share of the adapter stacks, and rank 0's writes and clears applied to it."""

    def __init__(self, model: CausalLM, config: LoRAConfig) -> None:
        self.model = model
        self.stacks = (config.max_loras, config.max_lora_rank) if config.enabled else (0, 0)
        self.targets: dict[tuple[int, str], LoraTarget] = (
            model.enable_lora(*self.stacks) if config.enabled else {}
        )

    def apply(self, command: LoraCommand) -> None:
        """Rank 0's adapter write or clear, on this rank's share of the slot. Stacks of another
        shape than rank 0's (a node started with other --enable-lora / --max-loras /
        --max-lora-rank flags) are made again as rank 0's before its first write."""
        if command.adapter is None:
            clear_adapter(self.targets, command.slot)
            return
        if command.stacks != self.stacks:
            logger.warning("LoRA stacks made again as rank 0's (slots, max rank) %s, not "
                           "this node's %s", command.stacks, self.stacks)  # fmt: skip
            self.targets, self.stacks = self.model.enable_lora(*command.stacks), command.stacks
        write_adapter(self.targets, command.slot, command.adapter)


@torch.inference_mode()
def serve_rank(spec: WorkerSpec, rank: int) -> None:
    """Join, load, then run steps until told to stop (or a peer fails)."""
    parallel = spec.parallel
    device = rank_device(spec.device, rank - parallel.node_ranks().start)
    if device.type == "cpu":
        torch.set_num_threads(threads_per_rank(parallel))
    group = open_group(parallel, rank, device, open_store(parallel, rank))
    try:
        model, _, _ = load_for_engine(
            spec.config, spec.resolved, spec.dtype, device, group=group, progress=False
        )
        arch, num_pages = model.arch, share_num_pages(group)
        kv_dtype = kv_cache_dtype(spec.config.cache.kv_cache_dtype, spec.dtype, device)
        shape = kv_cache_shape(
            num_pages, spec.config.cache.page_size, arch.num_kv_heads, arch.head_size, kv_dtype
        )
        kv_caches = [
            torch.zeros(shape, dtype=kv_dtype, device=device) for _ in range(arch.num_layers)
        ]
        lora = WorkerLora(model, spec.config.lora)
        channel = StepChannel(group)
        while (message := channel.receive()) is not None:
            if isinstance(message, LoraCommand):
                lora.apply(message)
            else:
                run_step(model, kv_caches, message, spec.dtype)
    finally:
        group.close()


def worker_main(spec: WorkerSpec, rank: int) -> None:
    """The spawned process's entry point."""
    exit_with_parent()
    logging.basicConfig(level=logging.WARNING)
    try:
        serve_rank(spec, rank)
    except Exception:
        logger.exception("tensor-parallel rank %d failed", rank)
        raise SystemExit(1) from None
