"""gguf_reader shares one reader per file, and reads a file rewritten at the same path afresh."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from pagedserve.core.gguf_reader import forget_readers, gguf_reader

gguf = pytest.importorskip("gguf")


def write(path: Path, value: int) -> None:
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_uint32("test.value", value)
    writer.add_tensor("t", np.full(4, value, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def value_of(path: Path) -> int:
    field = gguf_reader(path).fields["test.value"]
    return int(field.parts[field.data[0]][0])


def test_same_file_shares_a_reader_and_a_rewrite_is_seen(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    write(path, 1)
    assert gguf_reader(path) is gguf_reader(str(path)) and value_of(path) == 1
    write(path, 2)
    os.utime(path, ns=(1, 1))  # a different mtime even on a coarse clock
    assert value_of(path) == 2


def test_forgotten_readers_are_parsed_afresh(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    write(path, 3)
    first = gguf_reader(path)
    forget_readers()
    again = gguf_reader(path)
    assert again is not first and value_of(path) == 3 and gguf_reader(path) is again
