"""The one importer of the compiled modules.

`core` is pagedserve._core (always built). `cuda` is pagedserve._cuda, or None when the package
was built without a CUDA toolkit. The typed wrappers (core/sched/scheduler.py and the op modules
beside this one) use these and `require` for their argument checks; nothing else imports the
compiled modules. Torch-free: the scheduler's bookkeeping imports it.
"""

from __future__ import annotations

from typing import Protocol

from pagedserve import _core as core


class CudaKernels(Protocol):
    """What pagedserve._cuda holds (mypy checks the module, through its stub, against this)."""

    DECODE_SPLIT_LEN: int

    def paged_attention(
        self, args: core.AttentionArgs, workspace: int, max_splits: int, stream: int
    ) -> None: ...

    def reshape_and_cache(self, args: core.CacheWriteArgs, stream: int) -> None: ...


def _load_cuda() -> CudaKernels | None:
    try:
        from pagedserve import _cuda
    except ImportError:  # built without CUDA
        return None
    return _cuda


cuda = _load_cuda()

__all__ = ["CudaKernels", "core", "cuda", "require"]


def require(ok: bool, template: str, *args: object) -> None:
    """ValueError(template.format(*args)) unless ok. The message is formatted only on failure:
    the kernel wrappers check their arguments several times per layer and step."""
    if not ok:
        raise ValueError(template.format(*args))
