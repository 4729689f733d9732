"""PNG plots of a serving comparison (issue 17): output tokens/s, TTFT p50/p90 and inter-token
latency against concurrency, pagedserve beside each llama-server configuration, each titled with
the CPU model and the date of the run.

    python -m bench.serving.plots RUN_DIR                      # a bench/serving/compare.sh run folder
    python -m bench.serving.plots RUN_DIR --out bench/plots/x  # elsewhere (default: RUN_DIR/plots)
    python -m bench.serving.plots --results "2026-11-30 17:13" --out bench/plots/compare-20261130-1713

RUN_DIR is any folder of bench/serving/serving.py reports named `<server>__<case>.json` (compare.sh
writes them, with meta.json: date, load, CPU); cases `c<N>` are the concurrency grid, a case
named `mixed*` (if present) gets its own inter-token latency plot. `--results DATE` plots a
dated block of bench/RESULTS-log.md's serving section instead, from its per-run table (for runs whose
raw JSON is gone). Figures are only ever read from measurements, never typed in.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
from PIL import Image  # noqa: E402  (matplotlib's own dependency)

from bench.common import RESULTS_LOG
from bench.serving.compare_report import SECTION, load_runs

STYLE = {  # server -> (label, colour, marker)
    "pagedserve": ("pagedserve", "#2f5d8a", "o"),
    "pagedserve-nocache": ("pagedserve, no prefix cache", "#7fa6cc", "o"),
    "llama-q4_1": ("llama-server Q4_1", "#c2721a", "s"),
    "llama-q8_0": ("llama-server Q8_0", "#7a3fa0", "^"),
}
Runs = dict[tuple[str, str], dict[str, Any]]


@dataclass
class Source:
    runs: Runs
    date: str
    cpu: str
    note: str
    """How the run was made (quick grid, machine load), under the title."""
    workload: str = ""
    """Prompt and output lengths of the concurrency grid, when known."""


def from_run_dir(run_dir: Path) -> Source:
    meta_path = run_dir / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    note = " (quick grid)" if meta.get("quick") else ""
    if meta.get("load_before"):
        note += f"; load {meta['load_before']} -> {meta.get('load_after', '?')} on shared cores"
    date = meta.get("date", "date not recorded")
    runs = load_runs(run_dir)
    first = next((r for server in STYLE for _, r in grid(runs, server)), {})
    workload = ""
    if first.get("requested_prompt_tokens"):
        workload = f"{first['requested_prompt_tokens']}-token prompts, "
        workload += f"{first['requested_output_tokens']} out"
    cpu = meta.get("cpu", "CPU not recorded")
    return Source(runs, date, cpu, note.strip("; "), workload)


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _pair(cell: str, scale: float = 1.0) -> tuple[float | None, float | None]:
    parts = [None if p.strip() == "-" else float(p) * scale for p in cell.split("/")]
    return parts[0], parts[1]


def from_results(date: str, results: Path = RESULTS_LOG) -> Source:
    """The per-run table of the RESULTS-log.md block headed `### DATE...` in the serving section."""
    text = results.read_text()
    section = text[text.index(SECTION) :]
    match = re.search(rf"^### {re.escape(date)}(.*)$", section, re.M)
    if match is None:
        raise ValueError(f"--results: no block '### {date}' in {results.name}'s {SECTION}")
    block = section[match.end() :].split("\n### ")[0].split("\n## ")[0]
    runs: Runs = {}
    for line in block.splitlines():
        cells = _cells(line)
        if len(cells) != 11 or cells[0] not in STYLE:
            continue
        ttft50, ttft90 = _pair(cells[6])
        itl50, itl99 = _pair(cells[8], 1e-3)
        runs[(cells[0], cells[1])] = {
            "completed": int(cells[2].split("/")[0]),
            "output_tok_per_s": float(cells[4]),
            "ttft_s": {"p50": ttft50, "p90": ttft90},
            "itl_s": {"p50": itl50, "p99": itl99},
        }
    cpu = re.search(r"^CPU: (.+?)\.?$", block, re.M)
    load = re.search(r"^Load average[^:]*: ([^;]+); after: ([^(]+)", block, re.M)
    note = f"from RESULTS.md{match.group(1)}"
    if load:
        note += f"; load {load.group(1).strip()} -> {load.group(2).strip()} on shared cores"
    sizes = re.search(r"prompts (\d+)/\d+ tokens, outputs (\d+)", block)
    workload = f"{sizes.group(1)}-token prompts, {sizes.group(2)} out" if sizes else ""
    return Source(runs, date, cpu.group(1) if cpu else "CPU not recorded", note, workload)


def grid(runs: Runs, server: str) -> list[tuple[int, dict[str, Any]]]:
    """(concurrency, report) of the server's c<N> cases that completed requests, by concurrency."""
    points = []
    for (name, case), run in runs.items():
        found = re.fullmatch(r"c(\d+)", case)
        if name == server and found and run.get("completed", 0) > 0:
            points.append((int(found.group(1)), run))
    return sorted(points, key=lambda p: p[0])


def _figure(source: Source, title: str) -> tuple[Any, Any]:
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=100)
    fig.suptitle(f"{title}\n{source.cpu} · {source.date}", fontsize=10)
    if source.note:
        fig.text(0.5, 0.005, source.note, ha="center", va="bottom", fontsize=7, color="#555")
    ax.grid(True, alpha=0.3)
    return fig, ax


def _concurrency_axis(ax: Any, xs: list[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.minorticks_off()
    ax.set_xlabel("concurrent requests")


def _save(fig: Any, path: Path) -> Path:
    """A 256-colour PNG: a third of the bytes of matplotlib's RGBA, the same to the eye."""
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    Image.open(buffer).convert("RGB").quantize(colors=256).save(path, optimize=True)
    return path


def _pct(run: dict[str, Any], key: str, q: str) -> float | None:
    value = run.get(key)
    return value.get(q) if isinstance(value, dict) else None


def plot_throughput(source: Source, out: Path) -> Path | None:
    what = f" ({source.workload})" if source.workload else ""
    fig, ax = _figure(source, f"Output tokens/s vs concurrency{what}")
    xs: set[int] = set()
    for server, (label, colour, marker) in STYLE.items():
        points = grid(source.runs, server)
        if points:
            xs.update(c for c, _ in points)
            ax.plot([c for c, _ in points], [r["output_tok_per_s"] for _, r in points],
                    marker=marker, color=colour, label=label)  # fmt: skip
    if not xs:
        plt.close(fig)
        return None
    _concurrency_axis(ax, sorted(xs))
    ax.set_ylabel("output tokens/s (all requests)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    return _save(fig, out / "throughput.png")


def plot_latency(source: Source, out: Path, key: str, quantiles: tuple[str, str],
                 title: str, name: str, scale: float = 1.0, unit: str = "s") -> Path | None:  # fmt: skip
    """Two quantiles of `key` per server: the lower solid, the upper dashed."""
    fig, ax = _figure(source, title)
    xs: set[int] = set()
    for server, (label, colour, marker) in STYLE.items():
        points = grid(source.runs, server)
        for q, line in zip(quantiles, ("-", "--"), strict=True):
            ys = [_pct(r, key, q) for _, r in points]
            kept = [(c, y * scale) for (c, _), y in zip(points, ys, strict=True) if y is not None]
            if kept:
                xs.update(c for c, _ in kept)
                ax.plot(*zip(*kept, strict=True), line, marker=marker, color=colour,
                        label=f"{label} {q}")  # fmt: skip
    if not xs:
        plt.close(fig)
        return None
    _concurrency_axis(ax, sorted(xs))
    ax.set_yscale("log")
    ax.set_ylabel(f"{unit} (log scale)")
    ax.legend(fontsize=7, ncol=2)
    return _save(fig, out / name)


def plot_mixed(source: Source, out: Path) -> Path | None:
    """Inter-token latency p50/p90/p99 per server in the mixed-load case(s), as bars."""
    cases = sorted({case for _, case in source.runs if case.startswith("mixed")})
    if not cases:
        return None
    fig, ax = _figure(source, f"Inter-token latency under mixed load ({', '.join(cases)})")
    servers = [s for s in STYLE if any((s, c) in source.runs for c in cases)]
    width = 0.8 / max(1, len(servers))
    labels = [f"{c} {q}" for c in cases for q in ("p50", "p90", "p99")]
    for i, server in enumerate(servers):
        label, colour, _ = STYLE[server]
        values = [(_pct(source.runs.get((server, c), {}), "itl_s", q) or 0) * 1e3
                  for c in cases for q in ("p50", "p90", "p99")]  # fmt: skip
        ax.bar([j + i * width for j in range(len(labels))], values, width, color=colour,
               label=label)  # fmt: skip
    ax.set_xticks([j + width * (len(servers) - 1) / 2 for j in range(len(labels))], labels)
    ax.set_ylabel("ms between streamed tokens")
    ax.legend(fontsize=8)
    return _save(fig, out / "mixed_itl.png")


def plot_all(source: Source, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    made = [
        plot_throughput(source, out),
        plot_latency(
            source, out, "ttft_s", ("p50", "p90"), "Time to first token vs concurrency", "ttft.png"
        ),  # fmt: skip
        plot_latency(
            source,
            out,
            "itl_s",
            ("p50", "p99"),
            "Inter-token latency vs concurrency",
            "itl.png",
            1e3,
            "ms",
        ),  # fmt: skip
        plot_mixed(source, out),
    ]
    return [p for p in made if p is not None]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", type=Path, nargs="?", help="a compare.sh run folder")
    p.add_argument("--results", metavar="DATE", help="plot this dated block of RESULTS-log.md")
    p.add_argument("--out", type=Path, help="folder for the PNGs (default: RUN_DIR/plots)")
    a = p.parse_args(argv)
    if (a.run_dir is None) == (a.results is None):
        p.error("give RUN_DIR or --results DATE")
    try:
        source = from_results(a.results) if a.results else from_run_dir(a.run_dir)
    except ValueError as exc:
        p.error(str(exc))
    out = a.out or (a.run_dir / "plots" if a.run_dir else Path("plots"))
    for path in plot_all(source, out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
