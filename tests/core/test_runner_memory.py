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
