"""The faster shared reader parses exactly what gguf.GGUFReader parses."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFReader

from bench.common.tiny_models import write_gguf_llama
from pagedserve.core.gguf_reader import gguf_reader


def test_same_fields_and_tensors_as_gguf_reader(tmp_path: Path) -> None:
    path = tmp_path / "tiny.gguf"
    write_gguf_llama(path, qtype="Q8_0")
    ours, theirs = gguf_reader(path), GGUFReader(path)
    assert list(ours.fields) == list(theirs.fields)
    for key, field in theirs.fields.items():
        mine = ours.fields[key]
        assert (mine.types, mine.data) == (field.types, field.data), key
        assert all(np.array_equal(a, b) for a, b in zip(mine.parts, field.parts, strict=True))
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for mine, tensor in zip(ours.tensors, theirs.tensors, strict=True):
        assert mine.tensor_type == tensor.tensor_type
        assert np.array_equal(mine.data, tensor.data)
    assert gguf_reader(str(path)) is ours  # parsed once, shared
