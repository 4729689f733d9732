"""The one importer of the compiled modules.

`core` is pagedserve._core (always built). `cuda` is pagedserve._cuda, or None when the package
was built without a CUDA toolkit. The typed wrappers (core/scheduler.py and the op modules
beside this one) use these and `require` for their argument checks; nothing else imports the
compiled modules. Torch-free: the scheduler's bookkeeping imports it.
"""

from __future__ import annotations

from types import ModuleType

from pagedserve import _core as core

cuda: ModuleType | None
try:
    from pagedserve import _cuda as cuda
except ImportError:  # built without CUDA
    cuda = None

__all__ = ["core", "cuda", "require"]


def require(ok: bool, template: str, *args: object) -> None:
    """ValueError(template.format(*args)) unless ok. The message is formatted only on failure:
    the kernel wrappers check their arguments several times per layer and step."""
    if not ok:
        raise ValueError(template.format(*args))
