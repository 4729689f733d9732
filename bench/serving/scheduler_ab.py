"""pagedserve servers of two or more variants side by side on compare.sh's serving cases.

    python -m bench.serving.scheduler_ab --variant before:bench/.work/before --variant after:. \
        --repeats 3 [--mixed-seconds 30] [--cases c32,long,mixed] [--write]

A variant is NAME:TREE[:FLAGS]: a source tree (`.`, this checkout's editable install; any other
tree needs its own `_core` build, beside its sources or under its build/, as
bench/engine/determinism_cost.py describes) and extra `pagedserve serve` flags. Each repeat starts every variant's server in turn (alternating, on the
same free port scheme), runs bench/serving/serving.py's cases against it and stops it; the table holds
medians over the repeats, with the CPU model and the load average before and after.

Cases (compare.sh's shapes, on one server per variant and repeat, with the mixed case's KV room
and --max-model-len 4096): `c32`: 32 streams of 128-token prompts x 128 tokens (throughput);
`long`: one 1,000-token prompt at a time, 16 out (TTFT); `mixed`: 16 streams decoding (128 in,
128 out) while 2,200-token prompts (16 out) arrive 2 at a time for --mixed-seconds: the
decoders' inter-token latency and the long prompts' TTFT.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.common import ROOT, WORK, in_tree

NUM_PAGES = 18 * (2200 + 128 + 64) // 16  # compare.sh's mixed KV room: 18 slots
# case -> (serving.py arguments, the figures taken from its report: (column, key, stat))
CASES: dict[str, tuple[list[str], list[tuple[str, str, str]]]] = {
    "c32": (["--concurrency", "32", "--num-requests", "64", "--prompt-tokens", "128",
             "--output-tokens", "128"], [("c32 tok/s", "output_tok_per_s", "")]),
    "long": (["--concurrency", "1", "--num-requests", "3", "--prompt-tokens", "1000",
              "--output-tokens", "16", "--seed", "500"], [("1k TTFT p50 s", "ttft_s", "p50")]),
}  # fmt: skip
MIXED_LONG = ["--concurrency", "2", "--num-requests", "1000", "--prompt-tokens", "2200",
              "--output-tokens", "16", "--seed", "800"]  # fmt: skip
MIXED_DECODERS = ["--concurrency", "16", "--num-requests", "1000", "--prompt-tokens", "128",
                  "--output-tokens", "128", "--seed", "850"]  # fmt: skip
MIXED_FIGURES = [("mixed", "ITL p50 s", "itl_s", "p50"), ("mixed", "ITL p99 s", "itl_s", "p99"),
                 ("mixed_long", "long TTFT p50 s", "ttft_s", "p50"),
                 ("mixed_long", "long TTFT p99 s", "ttft_s", "p99"),
                 ("mixed_long", "long done", "completed", "")]  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(tree: str, flags: list[str], gguf: str, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    serve = ["serve", gguf, "--num-pages", str(NUM_PAGES), "--max-num-seqs", "64",
             "--max-model-len", "4096", "--port", str(port), *flags]  # fmt: skip
    # The tree's own pagedserve (bench/common/in_tree.py); this checkout's: the installed one.
    cmd = in_tree(tree, "-m", "pagedserve", *serve)
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        if proc.poll() is not None:
            raise RuntimeError(f"server died, see {log}")
        try:
            urllib.request.urlopen(url + "/health", timeout=2)
            return proc, url
        except OSError:
            time.sleep(1)
    raise RuntimeError(f"server not ready after 600 s, see {log}")


def stop_server(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def serving(url: str, pid: int, args: list[str], seconds: float) -> subprocess.Popen:
    cmd = [
        sys.executable,
        str(ROOT / "bench/serving/serving.py"),
        "--base-url",
        url + "/v1",
        "--server-kind",
        "pagedserve",
        "--pid",
        str(pid),
        "--max-seconds",
        str(seconds),
        *args,
    ]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)  # fmt: skip


def report(proc: subprocess.Popen) -> dict[str, Any]:
    out, _ = proc.communicate()
    return json.loads(out)


def pick(rep: dict[str, Any], key: str, stat: str) -> float:
    value = rep[key]
    return float(value[stat] if stat else value)


def run_variant(tree: str, flags: list[str], cases: list[str], opts: argparse.Namespace,
                log: Path) -> dict[str, float]:  # fmt: skip
    proc, url = start_server(tree, flags, opts.gguf, log)
    figures: dict[str, float] = {}
    try:
        report(serving(url, proc.pid, ["--concurrency", "2", "--num-requests", "2",
                                       "--output-tokens", "8", "--seed", "900"], 600))  # fmt: skip
        for case in cases:
            if case == "mixed":
                long = serving(url, proc.pid, MIXED_LONG, opts.mixed_seconds)
                reps = {"mixed": report(serving(url, proc.pid, MIXED_DECODERS, opts.mixed_seconds)),
                        "mixed_long": report(long)}  # fmt: skip
                for name, column, key, stat in MIXED_FIGURES:
                    figures[column] = pick(reps[name], key, stat)
                continue
            args, wanted = CASES[case]
            rep = report(serving(url, proc.pid, args, 600))
            for column, key, stat in wanted:
                figures[column] = pick(rep, key, stat)
    finally:
        stop_server(proc)
    return figures


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def table(results: dict[str, list[dict[str, float]]], meta: str) -> str:
    columns = list(next(iter(results.values()))[0])
    lines = [meta, "", "| variant | " + " | ".join(columns) + " |",
             "|---|" + "---:|" * len(columns)]  # fmt: skip
    for name, runs in results.items():
        cells = [f"{statistics.median(r[c] for r in runs):.3g}" for c in columns]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    from pagedserve.core.ops.cpu_features import cpu_model  # this checkout's, not a baseline's

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variant", action="append", required=True, help="NAME:TREE[:FLAGS]")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--mixed-seconds", type=float, default=30.0)
    p.add_argument("--cases", default="c32,long,mixed")
    p.add_argument("--gguf", default="")
    p.add_argument("--out", default="", help="run folder (default bench/.work/scheduler_ab-*)")
    opts = p.parse_args()
    if not opts.gguf:
        from pagedserve.core.models.resolve import resolve_model

        opts.gguf = str(resolve_model("").path)
    cases = opts.cases.split(",")
    variants = [(v.split(":", 2) + [""])[:3] for v in opts.variant]
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d-%H%M%S")
    run_dir = Path(opts.out or WORK / f"scheduler_ab-{stamp}")
    run_dir.mkdir(parents=True, exist_ok=True)
    before = load()
    results: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in variants}
    for repeat in range(opts.repeats):
        for name, tree, flags in variants:
            print(f"== repeat {repeat + 1} {name} (load {load()})", file=sys.stderr, flush=True)
            figures = run_variant(
                tree, flags.split(), cases, opts, run_dir / f"{name}-{repeat}.log"
            )
            print(f"   {figures}", file=sys.stderr, flush=True)
            results[name].append(figures)
    (run_dir / "results.json").write_text(json.dumps(results, indent=1))
    meta = (
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, CPU {cpu_model()}, "
        f"{os.cpu_count()} cores, OMP_NUM_THREADS {os.environ.get('OMP_NUM_THREADS', 'unset')}, "
        f"load average {before} before, {load()} after; medians of "
        f"{opts.repeats} alternating repeats; mixed for {opts.mixed_seconds:g} s; variants: "
        + "; ".join(f"{n} = `{t}` {f}".strip() for n, t, f in variants)
    )
    print(table(results, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
