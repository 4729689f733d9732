"""bench/engine/families.py --tiny: both configs (MoE, sliding window) run through pagedserve and
transformers on the same weights, and the JSON carries the CPU model and a figure per engine
(a smoke run: its figures rank nothing)."""

from __future__ import annotations

import json
import subprocess
import sys

from bench.common import ROOT


def test_families_bench_tiny_runs() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench.engine.families", "--tiny"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout)
    assert report["cpu"] and report["tiny"] and report["output_len"] == 24
    assert [r["config"] for r in report["results"]] == ["mixtral-moe", "mistral-window64"]
    for result in report["results"]:
        assert result["output_tok_s"]["pagedserve"] > 0 < result["output_tok_s"]["transformers"]
    window = report["results"][1]
    assert window["sliding_window"] < 32 + report["output_len"]  # the sequences cross it
