"""A shared, faster gguf.GGUFReader.

GGUFReader parses metadata through thousands of tiny slices of an np.memmap, and every memmap
slice runs memmap.__array_finalize__ in Python: a 49k-token vocabulary with 49k merges takes
seconds. Slicing a plain ndarray view of the same mapping gives identical arrays (still backed
by the mapped file) several times faster. Readers are cached per path so the model loader and the
tokenizer parse a file once. Torch-free: loading a GGUF vocabulary imports neither torch nor
the native ops.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFReader


class _PlainViewReader(GGUFReader):
    # Overrides GGUFReader._get (gguf >= 0.6, same signature); used by its __init__ for every
    # metadata and tensor-info read.
    def _get(
        self, offset: int, dtype: Any, count: int = 1, override_order: str | None = None
    ) -> np.ndarray:
        plain = self.__dict__.get("_plain")
        if plain is None:
            plain = self.__dict__["_plain"] = self.data.view(np.ndarray)
        count = int(count)
        size = np.dtype(dtype).itemsize * count
        arr = plain[offset : offset + size].view(dtype=dtype)[:count]
        order = self.byte_order if override_order is None else override_order
        ordered: np.ndarray = arr.view(arr.dtype.newbyteorder(order))
        return ordered


@functools.lru_cache(maxsize=4)
def _cached(path: Path, mtime_ns: int, size: int) -> GGUFReader:
    del mtime_ns, size  # part of the key only: a file rewritten in place is read afresh
    return _PlainViewReader(path, "r")


def gguf_reader(path: Path | str) -> GGUFReader:
    """A read-only, memory-mapped reader of the GGUF file at path, shared between callers
    while the file stays the same (path, modification time and size)."""
    resolved = Path(path).resolve()
    stat = resolved.stat()
    return _cached(resolved, stat.st_mtime_ns, stat.st_size)
