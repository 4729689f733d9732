"""Adapters under tensor parallelism: each rank's share of an adapter, and the adapter as two
flat tensors for rank 0's broadcast.

    shard = LoraShard("out", rank, tp)       a column-parallel layer's (q/k/v, gate/up)
    a, b = shard.cut(a, b)                   this rank's A [r, in] and B [out, r]
    meta, values = pack_adapter(adapter)     int64 [modules, 6], float32 [every A and B value]
    adapter = unpack_adapter(meta, values)   the same AdapterWeights, bit for bit

An adapter is sharded like the linear it modifies (models/tensor_parallel.py cuts the base):
- column-parallel (qkv_proj, gate_up_proj: each rank holds its own rows of each fused part's
  outputs): A [r, in] whole on every rank, B [out, r] cut by rows, the part's own rows in the
  shard's order (q's heads of this rank, then k's, then v's; gate's, then up's, as parts);
- row-parallel (o_proj, down_proj: each rank holds the input columns matching its slice):
  A cut by columns (its input features), B whole. Each rank adds x_r A_r B to its partial
  output before the base layer's all-reduce, so the one all-reduce sums the low-rank products
  with the base's (sum_r x_r A_r B = x A B): no collective of its own. (All-reducing x A, the
  rank-r intermediate, would cost a second all-reduce per layer, and the product (x A) B must
  then enter on one rank only.)

Only rank 0 reads an adapter's file and checks it against the whole model's shapes; the other
ranks receive the whole adapter (pack_adapter's tensors) and cut their share, so a file that
does not parse is refused once, before any rank writes a weight.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from pagedserve.core.lora.peft import TARGET_MODULES, AdapterWeights


@dataclass(frozen=True)
class LoraShard:
    """A rank's share of the adapters of one tensor-parallel layer."""

    split: Literal["out", "in"]
    """"out": B's rows (a column-parallel layer's); "in": A's columns (a row-parallel one's)."""
    rank: int
    size: int
    """The tensor-parallel size."""

    def whole(self, in_features: int, out_features: int) -> tuple[int, int]:
        """The whole model's (in, out) of a projection whose share is (in_features,
        out_features)."""
        if self.split == "out":
            return in_features, out_features * self.size
        return in_features * self.size, out_features

    def cut(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's (A [r, in], B [out, r]) of a whole adapter's pair."""
        if self.split == "out":
            n = b.shape[0] // self.size
            return a, b[self.rank * n : (self.rank + 1) * n]
        k = a.shape[1] // self.size
        return a[:, self.rank * k : (self.rank + 1) * k], b


_META = 6  # layer, module (TARGET_MODULES' index), r, in, out, scaling (float64 bits)


def pack_adapter(adapter: AdapterWeights) -> tuple[torch.Tensor, torch.Tensor]:
    """int64 [modules, 6] and float32 [A's then B's values, module by module]."""
    meta = np.zeros((len(adapter.modules), _META), dtype=np.int64)
    values: list[torch.Tensor] = []
    for i, ((layer, module), (a, b, scaling)) in enumerate(sorted(adapter.modules.items())):
        scale_bits = np.array([scaling], dtype=np.float64).view(np.int64)[0]
        meta[i] = (layer, TARGET_MODULES.index(module), a.shape[0], a.shape[1], b.shape[0],
                   scale_bits)  # fmt: skip
        values += [a.float().reshape(-1), b.float().reshape(-1)]
    flat = torch.cat(values) if values else torch.empty(0, dtype=torch.float32)
    return torch.from_numpy(meta), flat.contiguous()


def _constant(scaling: float) -> Callable[[int], float]:
    return lambda _rank: scaling


def unpack_adapter(meta: torch.Tensor, values: torch.Tensor) -> AdapterWeights:
    """pack_adapter's tensors back into the adapter."""
    rows = meta.cpu().numpy().reshape(-1, _META)
    values = values.cpu()
    adapter, offset = AdapterWeights(rank=0), 0
    for layer, module, r, k, n, scale_bits in rows.tolist():
        scaling = float(np.array([scale_bits], dtype=np.int64).view(np.float64)[0])
        a = values[offset : offset + r * k].view(r, k)
        b = values[offset + r * k : offset + r * k + n * r].view(n, r)
        offset += r * k + n * r
        adapter.add((layer, TARGET_MODULES[module]), a, b, _constant(scaling))
    return adapter
