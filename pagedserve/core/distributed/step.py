"""One step's inputs, sent from rank 0 to every worker: a small header, then one flat array.

    channel = StepChannel(group)
    inputs = channel.send(plan, prompt_rows)   # rank 0: broadcast, and its own StepInputs
    inputs = channel.receive()                 # a worker: the same StepInputs, or None: stop

Two broadcasts per step, whatever the batch: the header (int64 [8]: command and the array
lengths) on the control group, then every array the model needs concatenated into one int64
tensor on the data group. No Python object is pickled per step; only rank 0 samples, so the
sampling inputs stay there. prompt_rows are the (first row, row count) of each prompt-logprobs
chunk, in the order rank 0 computes their logits (each is a gather every rank joins).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from pagedserve.core.attention.base import AttentionMetadata
from pagedserve.core.distributed.group import TPGroup
from pagedserve.core.sched.scheduler import StepPlan

STOP, STEP = 0, 1
_HEADER = 8  # command, tokens, requests, page-table width, sampled, prompt chunks, max q, max s


@dataclass
class StepInputs:
    input_ids: torch.Tensor  # [num_tokens] int64
    positions: torch.Tensor  # [num_tokens] int64
    meta: AttentionMetadata
    sample_rows: torch.Tensor  # [num_sampled] int64: the token rows that sample
    prompt_rows: list[tuple[int, int]]
    """(first row, count) of each prompt-logprobs chunk, in order."""


def _flat(plan: StepPlan, prompt_rows: list[tuple[int, int]]) -> np.ndarray:
    rows = np.asarray(prompt_rows, dtype=np.int64).reshape(-1)
    parts = (plan.input_ids, plan.positions, plan.slot_mapping, plan.page_table.reshape(-1),
             plan.seq_lens, plan.query_start_loc, plan.logits_indices, rows)  # fmt: skip
    return np.concatenate([np.asarray(p, dtype=np.int64) for p in parts])


def _header(plan: StepPlan, num_prompt_rows: int) -> torch.Tensor:
    width = plan.page_table.shape[1] if plan.page_table.ndim == 2 else 0
    return torch.tensor(
        [STEP, plan.num_tokens, plan.num_reqs, width, len(plan.logits_indices),
         num_prompt_rows, plan.max_query_len, plan.max_seq_len],
        dtype=torch.int64,
    )  # fmt: skip


def _inputs(header: list[int], flat: torch.Tensor) -> StepInputs:
    _, tokens, reqs, width, sampled, chunks, max_query_len, max_seq_len = header
    sizes = [tokens, tokens, tokens, reqs * width, reqs, reqs + 1, sampled, 2 * chunks]
    ids, pos, slots, table, seq_lens, starts, sample, rows = torch.split(flat, sizes)
    i32 = torch.int32
    meta = AttentionMetadata(
        slot_mapping=slots,
        page_table=table.view(reqs, width).to(i32),
        seq_lens=seq_lens.to(i32),
        query_start_loc=starts.to(i32),
        max_query_len=max_query_len,
        max_seq_len=max_seq_len,
    )
    pairs = rows.view(chunks, 2).tolist()
    return StepInputs(ids, pos, meta, sample, [(a, n) for a, n in pairs])


class StepChannel:
    def __init__(self, group: TPGroup) -> None:
        self.group = group

    def send(self, plan: StepPlan, prompt_rows: list[tuple[int, int]]) -> StepInputs:
        header = _header(plan, len(prompt_rows))
        flat = torch.from_numpy(_flat(plan, prompt_rows)).to(self.group.device)
        self.group.broadcast_control(header)
        self.group.broadcast(flat)
        return _inputs(header.tolist(), flat)

    def receive(self) -> StepInputs | None:
        header = self.group.broadcast_control(torch.zeros(_HEADER, dtype=torch.int64))
        values = header.tolist()
        if values[0] == STOP:
            return None
        size = 3 * values[1] + values[2] * (values[3] + 2) + 1 + values[4] + 2 * values[5]
        flat = torch.empty(size, dtype=torch.int64, device=self.group.device)
        return _inputs(values, self.group.broadcast(flat))

    def stop(self) -> None:
        """Tell every worker to leave its loop (rank 0, between steps)."""
        header = torch.zeros(_HEADER, dtype=torch.int64)
        header[0] = STOP
        self.group.broadcast_control(header)
