"""What every native op wrapper shares: one declaration of a custom op, the dtype map, the row
checks.

    rms_norm_op = NativeOp.declare("rms_norm", rms_norm_eager, _check_norm, mutates=("out",))
    rms_norm_op(out, x, weight, eps)    # the body straight in eager code, the op when traced

Eager code calls the op's body straight: the dispatcher's cost per call on the CPU (see
bench/RESULTS.md) adds up over several calls per layer and step. Traced code (torch.compile) must call the registered op, whose fake
(meta) version only checks the arguments.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from pagedserve.core.ops.native import core, require

DTYPES = {
    torch.float32: core.DType.float32,
    torch.bfloat16: core.DType.bfloat16,
    torch.float16: core.DType.float16,
}
CPU_DTYPES = (torch.float32, torch.bfloat16)
"""The dtypes the CPU kernels take (CUDA also takes float16)."""


@dataclass(frozen=True, slots=True)
class NativeOp:
    """A custom op `pagedserve::<name>` and the plain function that is its body."""

    eager: Callable[..., None]
    """The body: checks, then the native call (output tensors passed in)."""
    op: Any
    """The registered op (torch.library.CustomOpDef), for traced code and opcheck."""

    @classmethod
    def declare(
        cls,
        name: str,
        eager: Callable[..., None],
        fake: Callable[..., None],
        mutates: tuple[str, ...],
    ) -> NativeOp:
        op = torch.library.custom_op(f"pagedserve::{name}", eager, mutates_args=mutates)
        op.register_fake(fake)
        return cls(eager, op)

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        (self.op if torch.compiler.is_compiling() else self.eager)(*args, **kwargs)


def check_rows(
    name: str, t: torch.Tensor, like: torch.Tensor, like_name: str, **dims: int | None
) -> None:
    """t: [num_tokens, *dims] (a dim given None: any size) in like's dtype and device,
    contiguous in its last dim. The dims are named for the messages (heads=4: "has 3 heads")."""
    shape = t.shape
    require(len(shape) == 1 + len(dims), "{} must be [num_tokens, {}], got {}", name,
            _Names(dims), tuple(shape))  # fmt: skip
    for axis, (dim, size) in enumerate(dims.items(), 1):
        require(size is None or shape[axis] == size, "{} has {} {}, {} has {}", name,
                shape[axis], dim, like_name, size)  # fmt: skip
    require(t.dtype == like.dtype, "{} dtype {} must match {} {}", name, t.dtype, like_name,
            like.dtype)  # fmt: skip
    require(t.device == like.device, "{} is on {}, {} on {}", name, t.device, like_name,
            like.device)  # fmt: skip
    require(t.stride(-1) == 1 or shape[-1] <= 1, "{} must be contiguous in its last dim", name)


class _Names:
    """The dims' names, joined only when a message is formatted."""

    def __init__(self, dims: dict[str, int | None]) -> None:
        self.dims = dims

    def __str__(self) -> str:
        return ", ".join(self.dims)
