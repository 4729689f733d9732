"""Adapter weights beside a base linear layer, and the step's grouped low-rank product.

    weights = LoraWeights(in_features, parts, num_slots, max_rank, dtype)   zeros, per layer
    weights.set_slot(slot, part, a, b, scaling)      an adapter's A [r, in], B [out_part, r]
    batch = LoraBatch.build(token_slots, dtype)      once per step: the rows of each adapter
    weights.add(y, x, batch)                         y[rows of s] += x[rows of s] A_s B_s

A layer holds one slot per adapter the engine may have loaded (--max-loras). A fused layer's
parts (q | k | v, gate | up) each get max_rank columns of A and the matching block of B, so one
product covers them all; the scaling (lora_alpha / r) is folded into B. Slots stay zero until
an adapter is written there, and a slot's zeros add nothing. `ranks` says how many columns of
each part a slot's adapter fills: the native kernel reads only those, so a rank-8 adapter costs
the same under --max-lora-rank 16 or 64.

On the CPU in float32 or bfloat16 the product is the native kernel's (lora/native.py): the
step's rows by segment of one slot, each row's delta summed in a fixed order (batch-invariant),
rows of the base model skipped. Elsewhere it groups the step's token rows by adapter: each group
gathered, padded to the longest, and run as one batched matmul per factor over the step's
adapters (index_select, bmm, bmm, index_add_); a step whose rows all use one adapter skips the
gather.

A gated MLP (gate | up before the activation) adds the adapters to its adapter rows only:
`gated_with_lora` runs the base rows through the gated kernel alone, so a base row's result
does not depend on the adapters beside it in the step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from pagedserve.core.lora.native import (
    Segments,
    native_add,
    native_applies,
    native_stacks,
)
from pagedserve.core.ops.native import core


@dataclass(frozen=True)
class LoraBatch:
    """The step's token rows grouped by adapter slot (rows of the base model are in none)."""

    slots: torch.Tensor  # [k] int64: the step's adapter slots
    rows: torch.Tensor  # [k * width] int64: each group's token rows, padded with row 0
    mask: torch.Tensor  # [k, width, 1]: 1 for a group's real rows, 0 for padding
    whole: int
    """The one slot every row of the step uses (the gather skipped), or -1."""
    segments: Segments
    """The native kernel's view: runs of rows with one slot (-1: base), on the CPU."""
    base_rows: torch.Tensor | None = None
    """[num_base] int64: the rows of the base model where the step also has some (else None)."""
    adapter_rows: torch.Tensor | None = None
    """[num_adapter] int64: the other rows, where base_rows is not None."""
    compact: LoraBatch | None = None
    """The adapter rows' batch once gathered (adapter_rows' order), where base_rows is not None."""

    @staticmethod
    def build(
        token_slots: np.ndarray, dtype: torch.dtype, device: torch.device | None = None
    ) -> LoraBatch | None:
        """token_slots: int [num_tokens], each row's slot or -1 (base); None when no row has
        an adapter."""
        active = np.unique(token_slots[token_slots >= 0])
        if len(active) == 0:
            return None
        batch = LoraBatch._grouped(token_slots, active, dtype, device)
        base = token_slots < 0
        if not base.any():
            return batch
        compact = LoraBatch._grouped(token_slots[~base], active, dtype, device)
        rows = [torch.from_numpy(np.flatnonzero(b)).to(device) for b in (base, ~base)]
        return LoraBatch(batch.slots, batch.rows, batch.mask, batch.whole, batch.segments,
                         rows[0], rows[1], compact)  # fmt: skip

    @staticmethod
    def _grouped(
        token_slots: np.ndarray, active: np.ndarray, dtype: torch.dtype, device: torch.device | None
    ) -> LoraBatch:
        segments = _segments(token_slots)
        empty = torch.empty(0, dtype=torch.int64, device=device)
        if len(active) == 1 and bool((token_slots == active[0]).all()):
            return LoraBatch(empty, empty, torch.empty(0, dtype=dtype), int(active[0]), segments)
        groups = [np.flatnonzero(token_slots == s) for s in active]
        width = max(len(g) for g in groups)
        rows = np.zeros((len(groups), width), dtype=np.int64)
        mask = np.zeros((len(groups), width, 1), dtype=np.float32)
        for i, group in enumerate(groups):
            rows[i, : len(group)] = group
            mask[i, : len(group)] = 1.0
        return LoraBatch(
            torch.from_numpy(active.astype(np.int64)).to(device),
            torch.from_numpy(rows.reshape(-1)).to(device),
            torch.from_numpy(mask).to(device=device, dtype=dtype),
            -1,
            segments,
        )


def _segments(token_slots: np.ndarray) -> Segments:
    """Runs of equal slots: starts [num_segments + 1], slots [num_segments]."""
    change = np.flatnonzero(token_slots[1:] != token_slots[:-1]) + 1
    starts = np.concatenate(([0], change, [len(token_slots)])).astype(np.int64)
    slots = token_slots[starts[:-1]].astype(np.int32)
    return Segments(torch.from_numpy(starts), torch.from_numpy(slots))


class LoraWeights(nn.Module):
    """One base layer's adapter stacks: a [slots, in, parts * max_rank], b [slots, parts *
    max_rank, out] (scaled), in the model's dtype."""

    def __init__(
        self,
        in_features: int,
        parts: list[int],  # the output widths of the fused parts, in column order
        num_slots: int,
        max_rank: int,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        self.parts, self.max_rank = parts, max_rank
        self.in_features, self.out_features = in_features, sum(parts)
        columns = len(parts) * max_rank
        self.a: torch.Tensor
        self.b: torch.Tensor
        self.register_buffer("a", torch.zeros(num_slots, in_features, columns, dtype=dtype),
                             persistent=False)  # fmt: skip
        self.register_buffer("b", torch.zeros(num_slots, columns, self.out_features, dtype=dtype),
                             persistent=False)  # fmt: skip
        # Each slot's rank: the columns of each part its adapter fills (0: empty). The native
        # kernel reads only those; the zeros past them would add nothing.
        self.ranks = torch.zeros(num_slots, dtype=torch.int32)
        self._stacks: tuple[int, int, core.LoraStacks] | None = None  # a's, b's address, view

    def native_stacks(self) -> core.LoraStacks:
        """The native kernel's view of a and b (rebuilt when .to() or the like moved them)."""
        where = (self.a.data_ptr(), self.b.data_ptr())
        if self._stacks is None or self._stacks[:2] != where:
            view = native_stacks(self.a, self.b, self.parts, self.max_rank, self.ranks)
            self._stacks = (*where, view)
        return self._stacks[2]

    def extra_repr(self) -> str:
        slots = self.a.shape[0]
        return f"{self.in_features} -> {self.parts}, {slots} slots of rank <= {self.max_rank}"

    def set_slot(
        self, slot: int, part: int, a: torch.Tensor, b: torch.Tensor, scaling: float
    ) -> None:
        """Part `part`'s adapter in `slot`: a [r, in], b [out_part, r] (checked by the caller)."""
        r, first = a.shape[0], part * self.max_rank
        start = sum(self.parts[:part])
        self.a[slot, :, first : first + r] = a.t().to(self.a.dtype)
        cols = slice(start, start + self.parts[part])
        self.b[slot, first : first + r, cols] = (b.float() * scaling).t().to(self.b.dtype)
        self.ranks[slot] = max(int(self.ranks[slot]), r)

    def clear_slot(self, slot: int) -> None:
        self.a[slot].zero_()
        self.b[slot].zero_()
        self.ranks[slot] = 0

    def add(self, y: torch.Tensor, x: torch.Tensor, batch: LoraBatch) -> torch.Tensor:
        """y [m, out] += each row's adapter product of x [m, in] (in place; returns y)."""
        if native_applies(y, x, self.a):
            return native_add(y, x, self.native_stacks(), batch.segments)
        with _one_thread():
            return self._add(y, x.to(self.a.dtype), batch)

    def _add(self, y: torch.Tensor, x: torch.Tensor, batch: LoraBatch) -> torch.Tensor:
        if batch.whole >= 0:
            delta = (x @ self.a[batch.whole]) @ self.b[batch.whole]
            return y.add_(delta.to(y.dtype))
        k, width = batch.mask.shape[0], batch.mask.shape[1]
        grouped = x.index_select(0, batch.rows).view(k, width, -1)
        low = torch.bmm(grouped, self.a.index_select(0, batch.slots)) * batch.mask
        delta = torch.bmm(low, self.b.index_select(0, batch.slots))
        return y.index_add_(0, batch.rows, delta.view(k * width, -1).to(y.dtype))


def add_lora(
    y: torch.Tensor, x: torch.Tensor, weights: LoraWeights | None, batch: LoraBatch | None
) -> torch.Tensor:
    """y plus the adapters' product where the layer has adapters and the step uses any."""
    if weights is None or batch is None:
        return y
    return weights.add(y, x, batch)


def gated_with_lora(
    x: torch.Tensor,  # [m, in]
    weights: LoraWeights,
    batch: LoraBatch,
    gated: Callable[[torch.Tensor], torch.Tensor],  # x -> act(gate) * up, [rows, width]
    pre_activation: Callable[[torch.Tensor], torch.Tensor],  # x -> gate | up, [rows, 2 width]
    activation: Callable[[torch.Tensor], torch.Tensor],  # gate | up -> act(gate) * up
) -> torch.Tensor:  # [m, width]
    """A gated MLP's product with the adapters added before the activation on the adapter rows;
    the base rows, where the step has some, run `gated` alone (the decoder stack does the same,
    bit for bit)."""
    if batch.base_rows is None or batch.adapter_rows is None or batch.compact is None:
        return activation(weights.add(pre_activation(x), x, batch))
    base = gated(x.index_select(0, batch.base_rows))
    xa = x.index_select(0, batch.adapter_rows)
    adapted = activation(weights.add(pre_activation(xa), xa, batch.compact))
    out = base.new_empty((x.shape[0], base.shape[1]))
    out.index_copy_(0, batch.base_rows, base)
    return out.index_copy_(0, batch.adapter_rows, adapted)


@contextmanager
def _one_thread() -> Iterator[None]:
    """torch on one thread for the adapters' small products: split over OpenMP threads they
    cost more in the threads' barrier than in arithmetic, and on a busy machine a barrier waits
    for a preempted peer (measured: 4 us alone, 50-120 ms on two threads under load)."""
    threads = torch.get_num_threads()
    if threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
