"""bench/serving/plots.py (issue 17): the same figures whether read from a compare.sh run folder or from
the table compare_report.py wrote for it, and one PNG per plot, titled with the CPU and date."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest

from tests.bench.test_serving_smoke import load_bench_module

SERVERS = {"pagedserve": 1.0, "llama-q4_1": 0.5, "llama-q8_0": 0.8}  # server -> speed factor


def _report(concurrency: int, speed: float) -> dict:
    def pct(p50: float) -> dict:
        return {"p50": p50, "p90": p50 * 2, "p99": p50 * 3, "mean": p50}

    return {"concurrency": concurrency, "completed": 4, "failed": 0,
            "requested_prompt_tokens": 128, "requested_output_tokens": 128,
            "output_tok_per_s": round(30.0 * concurrency ** 0.5 * speed, 2),
            "requests_per_s": 1.0, "prompt_tokens": pct(128), "ttft_s": pct(0.1 * concurrency),
            "itl_s": pct(0.01 * concurrency), "tpot_s": pct(0.02), "e2e_s": pct(2.0),
            "server_memory": {"peak_rss_mib": 900.0}}  # fmt: skip


@pytest.fixture
def bench() -> tuple[ModuleType, ModuleType]:
    return load_bench_module("plots"), load_bench_module("compare_report")


def test_run_folder_and_results_table_plot_the_same(
    bench: tuple[ModuleType, ModuleType], tmp_path: Path
) -> None:
    plots, report = bench
    run_dir = tmp_path / "compare-20260101-120000"
    run_dir.mkdir()
    for server, speed in SERVERS.items():
        for c in (1, 8, 32):
            (run_dir / f"{server}__c{c}.json").write_text(json.dumps(_report(c, speed)))
    (run_dir / "offline__c32.json").write_text(json.dumps({"output_tok_per_s": 50.0}))
    meta = {"date": "2026-01-01 12:00", "cpu": "Test CPU 9000", "quick": True,
            "load_before": "1.0 1.0 1.0", "load_after": "2.0 2.0 2.0",
            "setup": "Servers one at a time; prompts 128/1000 tokens, outputs 128 (c1-c64)."}  # fmt: skip
    (run_dir / "meta.json").write_text(json.dumps(meta))
    results = tmp_path / "RESULTS.md"
    report.write_section(report.render(run_dir), results)

    from_dir = plots.from_run_dir(run_dir)
    from_table = plots.from_results("2026-01-01 12:00", results)
    assert from_dir.cpu == from_table.cpu == "Test CPU 9000"
    assert from_dir.workload == from_table.workload == "128-token prompts, 128 out"
    for server in SERVERS:
        ours, theirs = plots.grid(from_dir.runs, server), plots.grid(from_table.runs, server)
        assert [c for c, _ in ours] == [c for c, _ in theirs] == [1, 8, 32]
        for (_, a), (_, b) in zip(ours, theirs, strict=True):
            assert b["output_tok_per_s"] == pytest.approx(a["output_tok_per_s"], abs=0.05)
            assert b["ttft_s"]["p90"] == pytest.approx(a["ttft_s"]["p90"], abs=0.005)
            assert b["itl_s"]["p99"] == pytest.approx(a["itl_s"]["p99"], abs=5e-5)

    made = plots.plot_all(from_dir, tmp_path / "png")
    assert [p.name for p in made] == ["throughput.png", "ttft.png", "itl.png"]
    for path in made:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000


def test_results_date_must_exist(bench: tuple[ModuleType, ModuleType], tmp_path: Path) -> None:
    plots, _ = bench
    results = tmp_path / "RESULTS.md"
    results.write_text("# r\n\n## Serving comparison (issue 5)\n\n### 2026-01-01 12:00\n")
    with pytest.raises(ValueError, match="no block"):
        plots.from_results("2099-01-01 00:00", results)
