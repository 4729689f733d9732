"""One step's inputs, sent from rank 0 to every worker: a small header, then one flat array.

    channel = StepChannel(group)
    inputs = channel.send(plan, prompt_rows)   # rank 0: broadcast, and its own StepInputs
    inputs = channel.receive()                 # a worker: the same StepInputs, or None: stop
    channel.send_lora(slot, adapter)           # rank 0, between steps: an adapter into a slot
    channel.clear_lora(slot)                   # ... and out (receive() gives a LoraCommand)

Two broadcasts per step, whatever the batch: the header (int64 [9]: command and the array
lengths) on the control group, then every array the model needs concatenated into one int64
tensor on the data group. No Python object is pickled per step; only rank 0 samples, so the
sampling inputs stay there. prompt_rows are the (first row, row count) of each prompt-logprobs
chunk, in the order rank 0 computes their logits (each is a gather every rank joins). A step
with adapter rows carries each request's adapter slot (-1: the base) at the end of the array,
from which every rank groups the same rows by adapter (StepInputs.lora_batch).

An adapter travels whole (lora/parallel.py's pack_adapter: its modules' shapes and scalings,
then every value in float32), and each worker cuts its own share.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from pagedserve.core.attention.base import AttentionMetadata
from pagedserve.core.distributed.group import TPGroup
from pagedserve.core.lora.parallel import pack_adapter, unpack_adapter
from pagedserve.core.lora.peft import AdapterWeights
from pagedserve.core.lora.weights import LoraBatch
from pagedserve.core.sched.scheduler import StepPlan

STOP, STEP, LORA_SET, LORA_CLEAR = 0, 1, 2, 3
_HEADER = 9
"""command, tokens, requests, page-table width, sampled, prompt chunks, max q, max s, whether
the step carries adapter slots; LORA_SET: command, slot, meta length, values length, the
stacks' slots and max rank (rank 0's); LORA_CLEAR: command, slot."""


@dataclass
class StepInputs:
    input_ids: torch.Tensor  # [num_tokens] int64
    positions: torch.Tensor  # [num_tokens] int64
    meta: AttentionMetadata
    sample_rows: torch.Tensor  # [num_sampled] int64: the token rows that sample
    prompt_rows: list[tuple[int, int]]
    """(first row, count) of each prompt-logprobs chunk, in order."""
    lora_slots: torch.Tensor | None = None
    """[num_reqs] int64: each request's adapter slot (-1: the base), where any has one."""

    def lora_batch(self, dtype: torch.dtype) -> LoraBatch | None:
        """The step's rows grouped by adapter, as rank 0's model runner groups them."""
        if self.lora_slots is None:
            return None
        counts = torch.diff(self.meta.query_start_loc.cpu()).numpy()
        token_slots = np.repeat(self.lora_slots.cpu().numpy(), counts)
        return LoraBatch.build(token_slots, dtype, self.lora_slots.device)


@dataclass(frozen=True)
class LoraCommand:
    """Rank 0's adapter write (adapter) or clear (None) of a slot, between steps."""

    slot: int
    adapter: AdapterWeights | None
    stacks: tuple[int, int] = (0, 0)
    """Rank 0's adapter stacks: (slots, max rank)."""


def _flat(
    plan: StepPlan, prompt_rows: list[tuple[int, int]], lora_slots: np.ndarray | None
) -> np.ndarray:
    rows = np.asarray(prompt_rows, dtype=np.int64).reshape(-1)
    parts = [plan.input_ids, plan.positions, plan.slot_mapping, plan.page_table.reshape(-1),
             plan.seq_lens, plan.query_start_loc, plan.logits_indices, rows]  # fmt: skip
    if lora_slots is not None:
        parts.append(lora_slots)
    return np.concatenate([np.asarray(p, dtype=np.int64) for p in parts])


def _header(plan: StepPlan, num_prompt_rows: int, has_lora: bool) -> torch.Tensor:
    width = plan.page_table.shape[1] if plan.page_table.ndim == 2 else 0
    return torch.tensor(
        [STEP, plan.num_tokens, plan.num_reqs, width, len(plan.logits_indices),
         num_prompt_rows, plan.max_query_len, plan.max_seq_len, int(has_lora)],
        dtype=torch.int64,
    )  # fmt: skip


def _inputs(header: list[int], flat: torch.Tensor) -> StepInputs:
    _, tokens, reqs, width, sampled, chunks, max_query_len, max_seq_len, has_lora = header
    sizes = [tokens, tokens, tokens, reqs * width, reqs, reqs + 1, sampled, 2 * chunks,
             reqs * has_lora]  # fmt: skip
    ids, pos, slots, table, seq_lens, starts, sample, rows, lora = torch.split(flat, sizes)
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
    return StepInputs(ids, pos, meta, sample, [(a, n) for a, n in pairs],
                      lora if has_lora else None)  # fmt: skip


class StepChannel:
    def __init__(self, group: TPGroup) -> None:
        self.group = group

    def send(
        self,
        plan: StepPlan,
        prompt_rows: list[tuple[int, int]],
        lora_slots: np.ndarray | None = None,
    ) -> StepInputs:
        """lora_slots: each request's adapter slot, where the step has adapter rows."""
        header = _header(plan, len(prompt_rows), lora_slots is not None)
        flat = torch.from_numpy(_flat(plan, prompt_rows, lora_slots)).to(self.group.device)
        self.group.broadcast_control(header)
        self.group.broadcast(flat)
        return _inputs(header.tolist(), flat)

    def send_lora(self, slot: int, adapter: AdapterWeights, num_slots: int, max_rank: int) -> None:
        """The whole adapter, for every rank to write its share into `slot` (of stacks of
        num_slots slots of rank <= max_rank)."""
        meta, values = pack_adapter(adapter)
        header = self._command(LORA_SET, slot, meta.numel(), values.numel(), num_slots, max_rank)
        self.group.broadcast_control(header)
        self.group.broadcast(meta.to(self.group.device))
        self.group.broadcast(values.to(self.group.device))

    def clear_lora(self, slot: int) -> None:
        self.group.broadcast_control(self._command(LORA_CLEAR, slot))

    @staticmethod
    def _command(*values: int) -> torch.Tensor:
        header = torch.zeros(_HEADER, dtype=torch.int64)
        header[: len(values)] = torch.tensor(values, dtype=torch.int64)
        return header

    def receive(self) -> StepInputs | LoraCommand | None:
        header = self.group.broadcast_control(torch.zeros(_HEADER, dtype=torch.int64))
        values = header.tolist()
        if values[0] == STOP:
            return None
        if values[0] in (LORA_SET, LORA_CLEAR):
            return self._receive_lora(values)
        size = 3 * values[1] + values[2] * (values[3] + 2 + values[8]) + 1 + values[4]
        size += 2 * values[5]
        flat = torch.empty(size, dtype=torch.int64, device=self.group.device)
        return _inputs(values, self.group.broadcast(flat))

    def _receive_lora(self, header: list[int]) -> LoraCommand:
        command, slot, meta_size, values_size, num_slots, max_rank = header[:6]
        if command == LORA_CLEAR:
            return LoraCommand(slot, None)
        device = self.group.device
        meta = self.group.broadcast(torch.empty(meta_size, dtype=torch.int64, device=device))
        values = self.group.broadcast(torch.empty(values_size, dtype=torch.float32, device=device))
        return LoraCommand(slot, unpack_adapter(meta, values), (num_slots, max_rank))

    def stop(self) -> None:
        """Tell every worker to leave its loop (rank 0, between steps)."""
        self.group.broadcast_control(self._command(STOP))
