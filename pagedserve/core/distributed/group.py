"""The tensor-parallel process group: who this rank is, and the few collectives the model uses.

    group = open_group(config, rank, device, store)    # joins every rank, or times out
    group.all_reduce(partial)        # row-parallel outputs: sum over ranks, in place
    group.gather_columns(logits)     # vocab shards -> full rows on rank 0
    group.broadcast(flat)            # rank 0's step arrays -> every rank (data backend)
    group.broadcast_control(header)  # the step header, over gloo with no deadline

Two groups: the data group (NCCL on CUDA, gloo on CPU) carries the step's arrays and the model's
collectives, with `distributed_timeout`, so a peer that vanished mid-step fails the step instead
of hanging it; the control group (gloo, CPU tensors) carries each step's small header, which an
idle worker waits on for as long as the server is idle, so it has no practical deadline. A peer
that dies closes its sockets, which gloo reports at once on either group.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed import Store, TCPStore  # type: ignore[attr-defined]

from pagedserve.core.config import ParallelConfig

IDLE_TIMEOUT = timedelta(days=365)
"""The control group's deadline: a worker waits this long for the next step."""


@dataclass
class TPGroup:
    rank: int
    world_size: int
    device: torch.device
    control: dist.ProcessGroup
    collective_seconds: float = field(default=0.0)
    """Wall time this rank spent in the step's collectives (all-reduce, gather, the arrays'
    broadcast), waits for a slower rank included."""

    @property
    def is_first(self) -> bool:
        return self.rank == 0

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """x summed over the ranks, in place (x is this rank's partial result)."""
        start = time.perf_counter()
        dist.all_reduce(x)
        self.collective_seconds += time.perf_counter() - start
        return x

    def gather_columns(self, x: torch.Tensor) -> torch.Tensor:
        """[n, cols] per rank -> [n, world_size * cols] on rank 0 (rank order); the other
        ranks get their own x back."""
        start = time.perf_counter()
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.world_size)] if self.is_first else None
        dist.gather(x, parts, dst=0)
        self.collective_seconds += time.perf_counter() - start
        return torch.cat(parts, dim=-1) if parts is not None else x

    def broadcast(self, x: torch.Tensor) -> torch.Tensor:
        """Rank 0's x into every rank's x (in place), on the data group."""
        start = time.perf_counter()
        dist.broadcast(x, src=0)
        self.collective_seconds += time.perf_counter() - start
        return x

    def broadcast_control(self, x: torch.Tensor) -> torch.Tensor:
        """Rank 0's CPU x into every rank's x (in place), on the control group (not counted in
        collective_seconds: a worker idles in it)."""
        dist.broadcast(x, src=0, group=self.control)
        return x

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def rank_device(device: torch.device, local_rank: int) -> torch.device:
    """The device a rank runs on: its own GPU (by its index on this node), or the CPU."""
    if device.type != "cuda":
        return device
    return torch.device("cuda", local_rank)


def open_store(config: ParallelConfig, rank: int) -> TCPStore:
    """The ranks' meeting point: rank 0 hosts it (port 0 picks a free one: read `.port`)."""
    return TCPStore(
        config.master_addr,
        config.master_port,
        config.tensor_parallel_size,
        is_master=rank == 0,
        timeout=timedelta(seconds=config.distributed_timeout),
        wait_for_workers=False,
    )


def open_group(config: ParallelConfig, rank: int, device: torch.device, store: Store) -> TPGroup:
    """Join the process group as `rank` (blocks until every rank has joined, or times out)."""
    if dist.is_initialized():
        raise RuntimeError("this process already belongs to a tensor-parallel group")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo",
        store=store,
        rank=rank,
        world_size=config.tensor_parallel_size,
        timeout=timedelta(seconds=config.distributed_timeout),
    )
    control = dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT)
    return TPGroup(rank, config.tensor_parallel_size, device, control)
