"""A shared, faster gguf.GGUFReader.

GGUFReader parses metadata through thousands of tiny slices of an np.memmap, and every memmap
slice runs memmap.__array_finalize__ in Python: a 49k-token vocabulary with 49k merges takes
seconds. Slicing a plain ndarray view of the same mapping gives identical arrays (still backed
by the mapped file) several times faster. Arrays of scalars and of strings (the vocabulary, its
scores and types, the merges) are walked in one loop each rather than one recursive call per
element, into the same parts (about ten times faster again: bench/RESULTS.md). Readers are
cached per path so the model loader and the tokenizer parse a file once, until the engine's
build is done with them (forget_readers: a 49k-token vocabulary with its merges is ~40 MiB of
parts). Torch-free: loading a GGUF vocabulary imports neither torch nor the native ops.
"""

from __future__ import annotations

import functools
import mmap
import struct
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFReader, GGUFValueType


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

    # Overrides GGUFReader._get_field_parts for arrays of scalars or strings in a file of this
    # machine's byte order; the parts, data indices and types are GGUFReader's own (one part per
    # scalar element; a length part and a bytes part per string). Anything else goes to it.
    def _get_field_parts(
        self, orig_offs: int, raw_type: int
    ) -> tuple[int, list[Any], list[int], list[Any]]:
        if raw_type != GGUFValueType.ARRAY or self.byte_order != "I":
            return super()._get_field_parts(orig_offs, raw_type)
        raw_itype = self._get(orig_offs, np.uint32)
        alen = self._get(orig_offs + 4, np.uint64)
        itype, count, offs = GGUFValueType(int(raw_itype[0])), int(alen[0]), orig_offs + 12
        parts: list[Any] = [raw_itype, alen]
        types = [GGUFValueType.ARRAY, itype] if count else [GGUFValueType.ARRAY]
        if itype == GGUFValueType.STRING:
            plain = self.__dict__["_plain"]  # set by the _get calls above
            buffer = memoryview(plain)
            unpack = struct.Struct("=Q").unpack_from  # the file's order is this machine's
            for _ in range(count):
                (size,) = unpack(buffer, offs)
                parts.append(plain[offs : offs + 8].view(np.uint64))
                parts.append(plain[offs + 8 : offs + 8 + size])
                offs += 8 + size
            return offs - orig_offs, parts, list(range(3, 2 + 2 * count, 2)), types
        nptype = self.gguf_scalar_to_np.get(itype)
        if nptype is None:  # arrays of arrays
            return super()._get_field_parts(orig_offs, raw_type)
        values = self._get(offs, nptype, count)
        parts += list(values.reshape(count, 1))
        return 12 + int(values.nbytes), parts, list(range(2, 2 + count)), types


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


def forget_readers() -> None:
    """Drop the shared readers: their parts (one array per vocabulary token and per merge, ~40
    MiB of Python objects for the default model) would otherwise stay for the life of the
    process. A later gguf_reader call parses its file afresh."""
    _cached.cache_clear()


def release_mapped_pages(path: Path | str) -> None:
    """Unmap from this process the pages of the file at path that it has read (they stay in the
    page cache, and a later read maps them back). A loaded model's weights are copies (packed,
    or dequantized), so otherwise the file would count in the process's RSS beside them."""
    memory = getattr(gguf_reader(path).data, "_mmap", None)  # np.memmap's own mapping
    if isinstance(memory, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED"):
        memory.madvise(mmap.MADV_DONTNEED)
