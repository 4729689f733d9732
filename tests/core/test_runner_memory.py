"""The start-up line's memory part (runner/memory.py): tensors counted once per storage, the
quantized blocks included, and the process's resident memory beside them."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest
import torch

from pagedserve import LLM
from pagedserve.core.models.resolve import ResolvedModel
from pagedserve.core.runner.memory import MiB, tensor_bytes


def test_tensor_bytes_counts_each_storage_once() -> None:
    a = torch.zeros(1024, dtype=torch.float32)
    b = torch.zeros(10, 10, dtype=torch.bfloat16)
    assert tensor_bytes([a, a[10:], a.view(32, 32), b]) == 4096 + 200
    assert tensor_bytes([torch.empty(8, device="meta")]) == 0


PROBE = """
import torch
from pagedserve.core.runner.memory import MiB, rss_bytes
before, _ = rss_bytes()
block = torch.ones(64 * MiB, dtype=torch.uint8)  # fresh pages, each touched: resident
now, peak = rss_bytes()
assert int(block.sum()) == 64 * MiB
print(before, now, peak)
"""


def test_rss_counts_what_a_process_touches() -> None:
    """In a fresh process (a long-lived one may reuse pages it already holds, so its RSS need
    not grow): 64 MiB touched show in RSS, and the peak is at least RSS."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=120
    )
    before, now, peak = map(int, done.stdout.split())
    assert now >= before + 60 * MiB and peak >= now


def test_start_up_line_names_weights_kv_and_the_rest(
    default_model: ResolvedModel, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="pagedserve.core.runner.model_runner")
    llm = LLM(str(default_model.path), num_pages=64)
    try:
        line = next(r.getMessage() for r in caplog.records if "memory:" in r.getMessage())
        runner = llm.engine.model_runner
        weights = tensor_bytes(runner.model.weight_tensors())
        kv = tensor_bytes(runner.kv_caches)
        assert f"weights {weights / MiB:.1f} MiB" in line
        assert f"KV cache {kv / MiB:.1f} MiB" in line
        assert "rest of the process" in line and "RSS" in line
        # The bundled Q4_1 file is 92 MB; its blocks stay packed, so the weights are about that
        # plus the embedding table (bf16: ~150 MiB in all; fp32 below ISA level avx2: ~205 MiB),
        # below the 257 MiB of the whole model in bf16.
        assert 60 * MiB < weights < 250 * MiB, line
    finally:
        llm.close()


FRAGMENTED = """
import ctypes
from pagedserve.core.runner.memory import MiB, rss_bytes, trim_malloc
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
chunks = [libc.malloc(1024) for _ in range(96 * 1024)]  # 96 MiB of small blocks on the heap
for p in chunks:
    ctypes.memset(p, 1, 1024)  # touched: resident
for p in chunks[:-1]:  # the last one pins the heap's top: free() alone gives nothing back
    libc.free(p)
freed, _ = rss_bytes()
trimmed = trim_malloc()
after, _ = rss_bytes()
print(int(trimmed), freed, after)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_trim_malloc_gives_back_freed_heap_pages() -> None:
    done = subprocess.run(
        [sys.executable, "-c", FRAGMENTED], capture_output=True, text=True, check=True, timeout=120
    )
    trimmed, freed, after = map(int, done.stdout.split())
    assert trimmed == 1 and after <= freed - 80 * MiB, (freed / MiB, after / MiB)


LEFT_BEHIND = """
import gc, sys
from gguf.gguf_reader import ReaderField
from pagedserve import LLM
llm = LLM(sys.argv[1], num_pages=16)
gc.collect()
print(sum(isinstance(o, ReaderField) for o in gc.get_objects()))
"""


def test_the_engine_keeps_no_parsed_gguf_metadata(default_model: ResolvedModel) -> None:
    """The readers' parts (one array per token and per merge: ~40 MiB for this vocabulary) go
    once the engine is built; the tokenizer and the weights hold their own copies."""
    done = subprocess.run(
        [sys.executable, "-c", LEFT_BEHIND, str(default_model.path)],
        capture_output=True, text=True, check=True, timeout=300,
    )  # fmt: skip
    assert done.stdout.split()[-1] == "0", done.stdout
