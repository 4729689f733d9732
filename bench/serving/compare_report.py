"""Turns one bench/serving/compare.sh run (a folder of serving.py JSON) into markdown (issue 5).

    python -m bench.serving.compare_report RUN_DIR            # print the tables
    python -m bench.serving.compare_report RUN_DIR --write    # also append them to bench/RESULTS-log.md

RUN_DIR holds `<server>__<case>.json` (servers: pagedserve, pagedserve-nocache, llama-q4_1,
llama-q8_0), `serving_ratio.json` from serving_ratio.py (serving / offline at c32 in alternating
waves; older runs have `offline__c32.json` from serving_offline.py instead) and meta.json (date,
load, flags).
Only the section "## Serving comparison (issue 5)" of RESULTS-log.md is touched: the dated block
goes at its end, other sections stay byte for byte.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from bench.common import BENCH, RESULTS_LOG

SECTION = "## Serving comparison (issue 5)"
SERVERS = ("pagedserve", "pagedserve-nocache", "llama-q4_1", "llama-q8_0")
PEERS = ("pagedserve", "llama-q4_1", "llama-q8_0")  # the summary's columns
CASES = ("c1", "c8", "c32", "c64", "long", "shared", "mixed", "mixed_long")
PLOTS = ("throughput.png", "ttft.png", "itl.png", "mixed_itl.png")  # bench/serving/plots.py's files
Runs = dict[tuple[str, str], dict[str, Any]]


def load_runs(run_dir: Path) -> Runs:
    runs: Runs = {}
    for path in sorted(run_dir.glob("*__*.json")):
        server, _, case = path.stem.partition("__")
        text = path.read_text().strip()
        if text:
            runs[(server, case)] = json.loads(text.splitlines()[-1])
    return runs


def stat(run: dict[str, Any] | None, key: str, q: str = "p50") -> float | None:
    if not run or run.get("completed", 1) == 0:  # the offline report has no "completed"
        return None
    value = run.get(key)
    return value.get(q) if isinstance(value, dict) else value


def fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def ratio(ours: float | None, theirs: float | None) -> str:
    return "-" if not ours or not theirs else f"{ours / theirs:.2f}x"


def detail_table(runs: Runs) -> list[str]:
    lines = ["| server | case | done/failed | prompt tok | out tok/s | req/s | TTFT p50 / p90 s "
             "| TPOT p50 ms | ITL p50 / p99 ms | e2e p50 s | peak RSS MiB |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for server in SERVERS:
        for case in CASES:
            run = runs.get((server, case))
            if run is None:
                continue
            tpot, itl50, itl99 = stat(run, "tpot_s"), stat(run, "itl_s"), stat(run, "itl_s", "p99")
            rss = (run.get("server_memory") or {}).get("peak_rss_mib")
            lines.append(
                f"| {server} | {case} | {run['completed']}/{run['failed']} "
                f"| {fmt(stat(run, 'prompt_tokens'), 0)} | {fmt(run['output_tok_per_s'], 1)} "
                f"| {fmt(run['requests_per_s'])} "
                f"| {fmt(stat(run, 'ttft_s'))} / {fmt(stat(run, 'ttft_s', 'p90'))} "
                f"| {fmt(tpot and tpot * 1e3, 1)} "
                f"| {fmt(itl50 and itl50 * 1e3, 1)} / {fmt(itl99 and itl99 * 1e3, 1)} "
                f"| {fmt(stat(run, 'e2e_s'))} | {fmt(rss, 0)} |"
            )
    return lines


def prompt_rate(run: dict[str, Any] | None) -> float | None:
    """Prompt tokens/s of a lone request: its prompt over its time to first token."""
    ttft, tokens = stat(run, "ttft_s"), stat(run, "prompt_tokens")
    return tokens / ttft if ttft and tokens else None


def target_rows(runs: Runs) -> list[tuple[str, float | None, float | None, float | None, str]]:
    """(figure, pagedserve, llama Q4_1, llama Q8_0, target vs Q4_1)."""

    def each(case: str, key: str) -> tuple[float | None, ...]:
        return tuple(stat(runs.get((server, case)), key) for server in PEERS)

    def rss(server: str) -> float | None:
        run = runs.get((server, "c32"))
        return (run.get("server_memory") or {}).get("peak_rss_mib") if run else None

    targets = {"c1": "report", "c32": ">= 2x"}
    rows = [(f"{c} output tok/s", *each(c, "output_tok_per_s"), targets.get(c, ""))
            for c in ("c1", "c8", "c32", "c64")]  # fmt: skip
    rows.append(("c8 TTFT p50 s", *each("c8", "ttft_s"), "<= 0.5x"))
    rows.append(("long (1,000 tok) TTFT p50 s", *each("long", "ttft_s"), "<= 0.5x"))
    rates = tuple(prompt_rate(runs.get((server, "long"))) for server in PEERS)
    rows.append(("long prompt tok/s", *rates, ""))
    rows.append(("shared prefix TTFT p50 s", *each("shared", "ttft_s"), "<= 0.1x"))
    rows.append(("c32 peak RSS MiB", *(rss(server) for server in PEERS), "report"))
    # Mixed load (issue 12): decoders' gaps while long prompts prefill, and those prompts' TTFT.
    p99 = tuple(stat(runs.get((server, "mixed")), "itl_s", "p99") for server in PEERS)
    rows.append(("mixed: decoders' ITL p99 s", *p99, "<= 0.25 s"))
    rows.append(("mixed: 2,200-tok prompts' TTFT p50 s", *each("mixed_long", "ttft_s"), "report"))
    return rows  # type: ignore[return-value]


def summary_table(runs: Runs) -> list[str]:
    lines = ["| figure | pagedserve | llama.cpp Q4_1 | ratio | llama.cpp Q8_0 | ratio | target "
             "(vs Q4_1) |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, ours, q4, q8, target in target_rows(runs):
        lines.append(f"| {name} | {fmt(ours)} | {fmt(q4)} | {ratio(ours, q4)} | {fmt(q8)} "
                     f"| {ratio(ours, q8)} | {target} |")  # fmt: skip
    return lines


def own_rows(runs: Runs, run_dir: Path) -> list[str]:
    """Figures of pagedserve against itself: prefix cache off, and the offline engine."""
    cached, uncached = (stat(runs.get((s, "shared")), "ttft_s") for s in SERVERS[:2])
    return [
        "| figure | value | target |", "|---|---|---|",
        f"| shared prefix TTFT p50: cache on / off | {fmt(cached)} s / {fmt(uncached)} s "
        f"= {ratio(cached, uncached)} | <= 0.33x |",
        serving_ratio_row(runs, run_dir),
    ]  # fmt: skip


def serving_ratio_row(runs: Runs, run_dir: Path) -> str:
    """serving_ratio.py's median over alternating pairs of waves; in older runs, the c32 case
    against one offline run made afterwards."""
    path = run_dir / "serving_ratio.json"
    if path.exists():
        f = json.loads(path.read_text())["this checkout"]
        return (f"| c32 output tok/s: serving / offline LLM.generate, median of {f['pairs']} "
                f"alternating pairs of waves (range) | {f['serving_tok_s']:.1f} / "
                f"{f['offline_tok_s']:.1f}: **{f['ratio_median']:.2f}x** ({f['ratio_min']:.2f}-"
                f"{f['ratio_max']:.2f}) | >= 0.90x |")  # fmt: skip
    serving, offline = (stat(runs.get((s, "c32")), "output_tok_per_s")
                        for s in ("pagedserve", "offline"))  # fmt: skip
    return (
        f"| c32 output tok/s: serving / offline LLM.generate | {fmt(serving, 1)} / "
        f"{fmt(offline, 1)} = {ratio(serving, offline)} | >= 0.90x |"
    )


def plot_links(run_dir: Path) -> list[str]:
    """The run's PNGs from bench/serving/plots.py (in bench/plots/<run>/), side by side."""
    folder = BENCH / "plots" / run_dir.name
    names = [n for n in PLOTS if (folder / n).exists()]
    if not names:
        return []
    images = " ".join(f"![{n[:-4]}](plots/{run_dir.name}/{n})" for n in names)
    return [images, ""]


def render(run_dir: Path) -> str:
    runs = load_runs(run_dir)
    meta = json.loads((run_dir / "meta.json").read_text())
    head = [f"### {meta['date']}{' (quick grid)' if meta.get('quick') else ''}", "",
            f"Load average (1/5/15 min) before: {meta.get('load_before', '?')}; after: "
            f"{meta.get('load_after', '?')} (2 cores, shared with other work).",
            f"CPU: {meta.get('cpu', 'not recorded')}.",
            f"Model: `{meta.get('model', '?')}`. {meta.get('setup', '')}", ""]  # fmt: skip
    body = [*summary_table(runs), "", *plot_links(run_dir), *own_rows(runs, run_dir), "",
            *detail_table(runs), ""]  # fmt: skip
    return "\n".join(head + body) + "\n"


def write_section(block: str, path: Path = RESULTS_LOG) -> None:
    """Appends the block at the end of our section (created at the end of the file if absent)."""
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    if SECTION not in text:
        text = text.rstrip("\n") + f"\n\n{SECTION}\n\n"
    start = text.index(SECTION) + len(SECTION)
    next_section = text.find("\n## ", start)
    end = len(text) if next_section < 0 else next_section + 1
    ours = text[start:end].rstrip("\n") + "\n\n" + block
    path.write_text(text[:start] + ours + ("\n" + text[end:] if end < len(text) else ""))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("--write", action="store_true", help="append to bench/RESULTS-log.md")
    a = p.parse_args(argv)
    block = render(a.run_dir)
    print(block)
    if a.write:
        write_section(block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
