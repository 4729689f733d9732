"""A node other than 0 of a multi-node tensor-parallel engine: workers only, no server.

    pagedserve serve MODEL --tensor-parallel-size 4 --nnodes 2 --node-rank 1 \\
        --master-addr NODE0 --master-port 29500

starts this node's ranks (tensor_parallel_size / nnodes of them) as spawned worker processes,
which meet node 0's at master_addr:master_port, and waits for them. It ends when they do: rank 0
said stop, a peer failed (a closed connection ends every rank's collective), or SIGTERM, which
terminates them first. Its exit code is the first failing worker's (0 when all stopped cleanly).
"""

from __future__ import annotations

import logging
import signal
import sys
from multiprocessing.connection import wait
from types import FrameType

from pagedserve.core.config import EngineConfig
from pagedserve.core.device_policy import choose_device, choose_dtype
from pagedserve.core.executor.launcher import spawn_workers, stop_processes
from pagedserve.core.executor.worker import WorkerSpec
from pagedserve.core.models.resolve import resolve_model

logger = logging.getLogger(__name__)


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    sys.exit(128 + signum)


def run_node(config: EngineConfig) -> int:
    """Run this node's workers until they end; the exit code to leave with."""
    parallel, mc = config.parallel, config.model
    if parallel.node_rank == 0:
        raise ValueError("node_rank: node 0 runs the server, not workers only")
    device = choose_device(mc.device)
    spec = WorkerSpec(
        resolved=resolve_model(mc.model),
        dtype=choose_dtype(mc.dtype, device),
        device=device,
        config=config,
        parallel=parallel,
    )
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    processes = spawn_workers(spec, parallel.node_ranks())
    logger.info("node %d: ranks %s started", parallel.node_rank, list(parallel.node_ranks()))
    try:
        running = list(processes)
        while running:
            wait([p.sentinel for p in running])
            for process in [p for p in running if not p.is_alive()]:
                running.remove(process)
                if process.exitcode:  # one rank failed: the others cannot go on
                    return process.exitcode
        return 0
    finally:
        stop_processes(processes, grace=0.0)
