"""bench/serving/serving.py against a live pagedserve: a few requests, and the JSON it prints."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from bench.common import ROOT
from bench.common.server import API_KEY, Server, start_server, stop_server

SCRIPT = ROOT / "bench" / "serving" / "serving.py"  # run by path: it imports nothing from bench
PERCENTILE_FIELDS = ("ttft_s", "itl_s", "tpot_s", "e2e_s")


def load_bench_module(name: str) -> ModuleType:
    """A module of bench/serving/, imported as the package it is (bench never edits sys.path)."""
    return importlib.import_module(f"bench.serving.{name}")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    flags = ["--api-key", API_KEY, "--max-model-len", "256", "--num-pages", "64",
             "--max-num-seqs", "8"]  # fmt: skip
    srv = start_server(tmp_path_factory.mktemp("bench_server"), *flags)
    yield srv
    assert stop_server(srv) == 0, srv.log()


def run_bench(server: Server, *args: str) -> dict:
    cmd = [sys.executable, str(SCRIPT), "--base-url", server.base_url + "/v1",
           "--api-key", API_KEY, "--server-kind", "pagedserve",
           "--pid", str(server.process.pid), *args]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr + done.stdout
    return json.loads(done.stdout)


def check_percentiles(report: dict) -> None:
    for name in PERCENTILE_FIELDS:
        stats = report[name]
        assert set(stats) == {"p50", "p90", "p99", "mean"}, name
        assert 0 < stats["p50"] <= stats["p90"] <= stats["p99"], (name, stats)
    assert report["ttft_s"]["p50"] <= report["e2e_s"]["p50"]


def test_fixed_concurrency_completions(server: Server) -> None:
    report = run_bench(server, "--concurrency", "2", "--num-requests", "4",
                       "--prompt-tokens", "40", "--output-tokens", "8")  # fmt: skip
    assert (report["completed"], report["failed"], report["not_finished"]) == (4, 0, 0)
    assert report["errors"] == []
    assert report["model"] == server.model
    # ignore_eos + min_tokens pin every output at exactly 8 tokens.
    assert report["output_tokens_total"] == 32
    # Calibrated against the server's own usage.prompt_tokens.
    assert abs(report["prompt_tokens"]["p50"] - 40) <= 2, report["prompt_tokens"]
    check_percentiles(report)
    assert report["output_tok_per_s"] > 0 and report["requests_per_s"] > 0
    memory = report["server_memory"]
    assert memory["pid"] == server.process.pid
    assert 0 < memory["peak_rss_mib"] <= memory["vm_hwm_mib"]


def test_poisson_chat_shared_prefix(server: Server) -> None:
    report = run_bench(server, "--endpoint", "chat", "--request-rate", "20",
                       "--concurrency", "0", "--num-requests", "3", "--shared-prefix",
                       "--prompt-tokens", "48", "--output-tokens", "4")  # fmt: skip
    assert (report["completed"], report["failed"]) == (3, 0)
    assert report["endpoint"] == "chat" and report["request_rate"] == 20
    assert report["output_tokens_per_request"]["p50"] == 4
    # One shared prompt: every request reports the same length.
    assert report["prompt_tokens"]["p50"] == report["prompt_tokens"]["p99"]
    check_percentiles(report)


def test_refuses_non_loopback_and_bad_values(capsys: pytest.CaptureFixture[str]) -> None:
    serving = load_bench_module("serving")
    assert serving.main(["--base-url", "http://192.0.2.1:8000/v1"]) == 2
    assert "not a loopback address" in capsys.readouterr().err
    assert serving.main(["--num-requests", "0"]) == 2
    assert "--num-requests" in capsys.readouterr().err


def test_frame_parsing_and_percentiles() -> None:
    serving = load_bench_module("serving")
    assert serving.parse_frame("data: [DONE]") is None
    assert serving.parse_frame(": keep-alive") is None
    chat = serving.parse_frame('data: {"choices": [{"delta": {"content": "hi"}}]}')
    assert serving.frame_text(chat) == "hi"
    assert serving.frame_text({"choices": [{"text": "yo"}]}) == "yo"
    assert serving.frame_text({"choices": [], "usage": {"completion_tokens": 3}}) == ""
    stats = serving.percentiles([float(v) for v in range(1, 101)])
    assert stats == {"p50": 50.5, "p90": 90.1, "p99": 99.01, "mean": 50.5}
    assert serving.percentiles([]) is None


def test_report_writes_only_its_section(tmp_path: Path) -> None:
    report = load_bench_module("compare_report")
    results = tmp_path / "RESULTS.md"
    before = "# Results\n\n## Offline throughput (issue 3)\n\nfigures\n"
    after = "## Later (issue 9)\n\nmore\n"
    results.write_text(before)
    report.write_section("### run 1\n\n| a |\n", results)  # absent: created at the end
    assert results.read_text().startswith(before)
    results.write_text(results.read_text() + "\n" + after)
    report.write_section("### run 2\n\n| b |\n", results)  # present: appended inside it
    text = results.read_text()
    ours = text[text.index(report.SECTION) : text.index(after)]
    assert ours.index("### run 1") < ours.index("### run 2")
    # Everything around our section is kept byte for byte (blank separator lines aside).
    assert text.startswith(before) and text.endswith(after)
    assert text.replace(ours, "").replace("\n", "") == (before + after).replace("\n", "")


def test_report_ratios(tmp_path: Path) -> None:
    report = load_bench_module("compare_report")

    def run(tok_s: float, ttft: float) -> str:
        stats = {"p50": ttft, "p90": ttft, "p99": ttft, "mean": ttft}
        return json.dumps({"completed": 4, "failed": 0, "output_tok_per_s": tok_s,
                           "requests_per_s": 1.0, "ttft_s": stats, "itl_s": stats,
                           "tpot_s": stats, "e2e_s": stats, "prompt_tokens": stats})  # fmt: skip

    (tmp_path / "pagedserve__c32.json").write_text(run(300.0, 0.5))
    (tmp_path / "llama-q4_1__c32.json").write_text(run(150.0, 2.0))
    (tmp_path / "offline__c32.json").write_text(json.dumps({"output_tok_per_s": 400.0}))
    (tmp_path / "meta.json").write_text(json.dumps({"date": "2026-01-01 00:00"}))
    text = report.render(tmp_path)
    assert "| c32 output tok/s | 300.00 | 150.00 | 2.00x | - | - | >= 2x |" in text
    assert "300.0 / 400.0 = 0.75x" in text


def test_report_reads_the_alternating_ratio(tmp_path: Path) -> None:
    """A run with serving_ratio.py's figures reports its median and range, not the c32 case
    against a lone offline run."""
    report = load_bench_module("compare_report")
    (tmp_path / "serving_ratio.json").write_text(json.dumps({"this checkout": {
        "pairs": 4, "ratio_median": 0.934, "ratio_min": 0.87, "ratio_max": 0.99,
        "serving_tok_s": 812.5, "offline_tok_s": 870.0}}))  # fmt: skip
    (tmp_path / "offline__c32.json").write_text(json.dumps({"output_tok_per_s": 400.0}))
    (tmp_path / "meta.json").write_text(json.dumps({"date": "2026-01-01 00:00"}))
    text = report.render(tmp_path)
    assert (
        "median of 4 alternating pairs of waves (range) | 812.5 / 870.0: **0.93x** (0.87-0.99)"
        in text
    )
    assert "= 0.75x" not in text and "400.0" not in text


def test_serving_ratio_alternates_waves(tmp_path: Path) -> None:
    """bench/serving/serving_ratio.py (compare.sh's serving / offline figure) end to end on tiny waves:
    a server and an offline engine loaded side by side, a ratio per pair (a smoke run: its
    figures rank nothing)."""
    figures = tmp_path / "ratio.json"
    cmd = [sys.executable, "-m", "bench.serving.serving_ratio", "--pairs", "2",
           "--num-requests", "4", "--prompt-tokens", "16", "--output-tokens", "4",
           "--work", str(tmp_path / "work"), "--json", str(figures)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "CPU: " in done.stdout and "| this checkout | 2 |" in done.stdout
    f = json.loads(figures.read_text())["this checkout"]
    assert f["pairs"] == 2 and f["serving_tok_s"] > 0 < f["offline_tok_s"]
    assert f["ratio_min"] <= f["ratio_median"] <= f["ratio_max"]
    assert done.stderr.count("this checkout: serving") == 2
