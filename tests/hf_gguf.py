"""transformers' own GGUF loading (the oracle's), several times faster.

transformers parses a GGUF with gguf.GGUFReader (twice per model: config, then weights), whose
metadata parse takes seconds on the default model's 49k-token vocabulary, and builds gguf's
tensor-name map once per tensor (seconds again for 272 tensors). Inside `fast_gguf_parsing()`
it gets pagedserve's shared reader instead, which parses into the same fields and tensors
(tests/core/test_gguf_reader.py checks that part by part), and a name map built once per
architecture and layer count. What transformers computes from them (the config, the name mapping,
gguf's dequantization, the tokenizer's conversion) is its own, unchanged.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager

import gguf

from pagedserve.core.gguf_reader import gguf_reader


@contextmanager
def fast_gguf_parsing() -> Iterator[None]:
    saved = gguf.GGUFReader, gguf.get_tensor_name_map
    gguf.GGUFReader = lambda path, mode="r": gguf_reader(path)  # type: ignore[assignment,misc]
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(saved[1])
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = saved
