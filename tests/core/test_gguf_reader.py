"""The faster shared reader parses exactly what gguf.GGUFReader parses."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFWriter

from bench.common.tiny_models import write_gguf_llama
from pagedserve.core.gguf_reader import gguf_reader


def assert_same_fields(ours: GGUFReader, theirs: GGUFReader) -> None:
    assert list(ours.fields) == list(theirs.fields)
    for key, field in theirs.fields.items():
        mine = ours.fields[key]
        assert (mine.offset, mine.types, mine.data) == (field.offset, field.types, field.data), key
        for a, b in zip(mine.parts, field.parts, strict=True):
            assert (a.dtype, a.shape) == (b.dtype, b.shape) and np.array_equal(a, b), key


def test_same_fields_and_tensors_as_gguf_reader(tmp_path: Path) -> None:
    path = tmp_path / "tiny.gguf"
    write_gguf_llama(path, qtype="Q8_0")
    ours, theirs = gguf_reader(path), GGUFReader(path)
    assert_same_fields(ours, theirs)
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for mine, tensor in zip(ours.tensors, theirs.tensors, strict=True):
        assert mine.tensor_type == tensor.tensor_type
        assert np.array_equal(mine.data, tensor.data)
    assert gguf_reader(str(path)) is ours  # parsed once, shared


def test_arrays_of_every_kind_parse_as_gguf_reader_parses_them(tmp_path: Path) -> None:
    """The array fast path: strings (empty ones too), scalars of several widths, an empty array
    and an array of arrays (which goes to GGUFReader's own code)."""
    path = tmp_path / "arrays.gguf"
    writer = GGUFWriter(path, "llama")
    writer.add_array("t.strings", ["a", "", "ünïcode", "x" * 300])
    writer.add_array("t.ints", [1, -2, 3])
    writer.add_array("t.floats", [0.5, -1.25])
    writer.add_array("t.bools", [True, False])
    writer.add_array("t.empty", [])
    writer.add_array("t.nested", [[1, 2], [3]])
    writer.add_string("t.after", "the offsets after the arrays hold")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    ours, theirs = gguf_reader(path), GGUFReader(path)
    assert_same_fields(ours, theirs)
    assert ours.fields["t.after"].contents() == "the offsets after the arrays hold"
    assert ours.fields["t.strings"].contents() == ["a", "", "ünïcode", "x" * 300]
