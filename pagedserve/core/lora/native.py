"""The adapters' grouped product on the native kernel (pagedserve._core.lora_add, cpp/src/lora/).

    stacks = native_stacks(weights)          a LoraWeights' a / b as the kernel's LoraStacks
    if native_applies(y, x, weights): native_add(y, x, stacks, segments)

For each row of a segment whose slot is >= 0: y += (x a[slot]) b[slot], in fp32 FMAs in a fixed
order per row (a row's delta does not depend on the other rows of the step, the thread count or
the ISA level), rounded once into y; a fused layer's parts skip b's zero blocks. Float32 and
bfloat16 CPU tensors; elsewhere weights.py's torch product runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pagedserve.core.ops.native import core, require

DTYPES = (torch.float32, torch.bfloat16)


@dataclass(frozen=True)
class Segments:
    """A step's rows by slot: segment i covers rows [starts[i], starts[i + 1]) and runs
    slots[i] (-1: the base model)."""

    starts: torch.Tensor  # [num_segments + 1] int64, CPU
    slots: torch.Tensor  # [num_segments] int32, CPU

    @property
    def num_segments(self) -> int:
        return int(self.slots.shape[0])


def native_stacks(
    a: torch.Tensor,  # [num_slots, k, parts * max_rank]
    b: torch.Tensor,  # [num_slots, parts * max_rank, n]
    parts: list[int],
    max_rank: int,
    ranks: torch.Tensor,  # [num_slots] int32, CPU: the columns of each part a slot fills
) -> core.LoraStacks:
    """The kernel's view of the stacks (pointers: a, b and ranks must outlive it, in place; the
    kernel reads ranks at each call, so a slot's rank may change in place)."""
    require(a.dtype in DTYPES and b.dtype == a.dtype and a.device.type == "cpu"
             and a.is_contiguous() and b.is_contiguous(),
             "lora stacks must be contiguous float32 or bfloat16 CPU tensors")  # fmt: skip
    require(ranks.dtype == torch.int32 and ranks.device.type == "cpu" and ranks.is_contiguous()
             and ranks.shape == (a.shape[0],), "lora ranks must be [num_slots] int32 on the CPU")  # fmt: skip
    return core.LoraStacks(a=a.data_ptr(), b=b.data_ptr(), ranks=ranks.data_ptr(),
                           num_slots=a.shape[0], k=a.shape[1], max_rank=max_rank,
                           part_widths=parts, float32=a.dtype == torch.float32)  # fmt: skip


def native_applies(y: torch.Tensor, x: torch.Tensor, a: torch.Tensor) -> bool:
    """Whether the kernel takes these rows: CPU, float32 / bfloat16, 2-D with unit column
    stride."""
    return all(
        t.device.type == "cpu" and t.dtype in DTYPES and t.dim() == 2 and t.stride(1) == 1
        for t in (y, x)
    ) and (a.device.type == "cpu" and a.dtype in DTYPES)


def native_add(
    y: torch.Tensor,  # [m, n], added to in place
    x: torch.Tensor,  # [m, k]
    stacks: core.LoraStacks,
    segments: Segments,
) -> torch.Tensor:
    require(x.shape[0] == y.shape[0] and x.shape[1] == stacks.k and y.shape[1] == stacks.n,
             "lora: x {} and y {} do not fit stacks [{} -> {}]", tuple(x.shape),
             tuple(y.shape), stacks.k, stacks.n)  # fmt: skip
    require(int(segments.starts[-1]) == x.shape[0], "lora: segments cover {} rows, x has {}",
             int(segments.starts[-1]), x.shape[0])  # fmt: skip
    core.lora_add(x=x.data_ptr(), x_stride=x.stride(0), x_float32=x.dtype == torch.float32,
                  y=y.data_ptr(), y_stride=y.stride(0), y_float32=y.dtype == torch.float32,
                  stacks=stacks, starts=segments.starts.data_ptr(),
                  slots=segments.slots.data_ptr(), num_segments=segments.num_segments,
                  num_threads=torch.get_num_threads())  # fmt: skip
    return y


def lora_path() -> str:
    """The ISA level whose copy of the kernel runs ("portable", "avx2", "avx512")."""
    return str(core.lora_path())
