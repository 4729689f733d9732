"""Serving vs the offline engine at c=32, and where the difference goes (issue 15): this checkout
vs a baseline tree, side by side, builds alternating repeat by repeat.

    git archive <baseline-rev> | tar -x -C /tmp/base
    cp build/dev/_core*.so /tmp/base/pagedserve/   # same native code (else: determinism_cost.py)
    python -m bench.serving.serving_overhead --baseline /tmp/base --repeats 3

Per build and repeat: `pagedserve serve` on a loopback port, that build's own bench/serving/serving.py
(the load generator shares the 2 cores with the server, so its CPU is part of the comparison) at
--concurrency 32 (32 requests unless --num-requests), 128-token prompts, 128 tokens out, then
bench/serving/serving_offline.py on the prompts it sent. Reported: output tok/s both ways and their ratio; CPU microseconds per streamed token
of the server's event loop (its main thread) and of the load generator; and, from a trace of
LLMEngine.step in both processes, per decode step of 32 sequences (medians, ms): the model
(ModelRunner.execute), the rest of the step (schedule, outputs) and the gap between two steps.
Medians over repeats; the CPU model and load averages are printed with the table.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from bench.common import ROOT, WORK, in_tree


def traced(argv: list[str]) -> int:
    """Run `-m MODULE ARGS...` (bench.common.in_tree loaded the tree's pagedserve), recording
    (start, end, model seconds, sampled sequences) of every LLMEngine.step into $TRACE at exit;
    with $SYNTHETIC_FORWARD_S, a sleep that samples a constant token replaces the model."""
    import atexit
    import runpy

    from bench.common.in_tree import first_module

    # Their homes since issue 37's regrouping, then before it (a baseline tree's layout).
    engine = first_module("pagedserve.core.engine.llm_engine", "pagedserve.core.engine")
    runner = first_module("pagedserve.core.runner.model_runner", "pagedserve.core.model_runner")
    steps: list[tuple[float, float, float, int]] = []
    model: list[float] = []
    execute, step = runner.ModelRunner.execute, engine.LLMEngine.step
    if os.environ.get("SYNTHETIC_FORWARD_S"):  # the HTTP path alone: a sleep for the model
        import numpy as np

        def execute(self: Any, plan: Any, sample_seqs: list, prompt_specs: list) -> Any:
            time.sleep(float(os.environ["SYNTHETIC_FORWARD_S"]))
            return runner.StepResult(np.full(len(sample_seqs), 1000, np.int32), None, {})

    def timed_execute(self: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return execute(self, *args, **kwargs)
        finally:
            model.append(time.perf_counter() - start)

    def traced_step(self: Any, *args: Any, **kwargs: Any) -> Any:
        start, before = time.perf_counter(), len(model)
        outputs = step(self, *args, **kwargs)
        spent = model[-1] if len(model) > before else 0.0
        steps.append((start, time.perf_counter(), spent, len(outputs)))
        return outputs

    runner.ModelRunner.execute, engine.LLMEngine.step = timed_execute, traced_step
    atexit.register(lambda: Path(os.environ["TRACE"]).write_text(json.dumps(steps)))
    if argv[:1] != ["-m"] or len(argv) < 2:
        sys.exit("traced: -m MODULE [ARGS...]")
    sys.argv = argv[1:]
    runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    return 0


SERVE = ["--num-pages", "640", "--max-num-seqs", "64", "--max-model-len", "2048"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds of each thread of a process."""
    ticks, out = os.sysconf("SC_CLK_TCK"), {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / ticks
    return out


def busy_cores_seconds() -> float:
    """CPU seconds every core has spent busy since boot (/proc/stat's first line)."""
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(
        int, Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]
    )
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


class Others:
    """How many cores the rest of the machine (other users' work) kept busy meanwhile."""

    def __init__(self) -> None:
        self.start, self.wall = busy_cores_seconds(), time.perf_counter()

    def cores(self, ours_s: float) -> float:
        """Other processes' busy cores since start, given the CPU seconds ours used."""
        wall = time.perf_counter() - self.wall
        return max(0.0, busy_cores_seconds() - self.start - ours_s) / max(wall, 1e-9)


def wait_for_quiet(limit: float, patience_s: float) -> float:
    """Wait (up to patience_s) until other processes use under `limit` cores for 3 s."""
    deadline = time.monotonic() + patience_s
    while True:
        others = Others()
        time.sleep(3)
        cores = others.cores(0.0)
        if cores < limit or time.monotonic() > deadline:
            return cores
        time.sleep(5)


def launch(tree: str, trace: Path, args: list[str], **kw: Any) -> subprocess.Popen[bytes]:
    env = {**os.environ, "TRACE": str(trace)}
    cmd = in_tree(tree, "bench.serving.serving_overhead:traced", *args)
    return subprocess.Popen(cmd, cwd=ROOT, env=env, **kw)


def decode_steps(trace: Path) -> dict[str, float]:
    """Median ms per decode step of 32 sequences: model, rest of the step, gap before it."""
    steps = json.loads(trace.read_text())
    rows = [(b, a) for a, b in zip(steps, steps[1:], strict=False) if b[3] == 32 == a[3]]
    if not rows:
        return {}
    return {"model_ms": median_ms([s[2] for s, _ in rows]),
            "rest_ms": median_ms([s[1] - s[0] - s[2] for s, _ in rows]),
            "gap_ms": median_ms([s[0] - prev[1] for s, prev in rows])}  # fmt: skip


def median_ms(seconds: list[float]) -> float:
    return round(1000 * statistics.median(seconds), 2)


def serve(
    tree: str, client: Path, work: Path, model: str, num_requests: int
) -> tuple[dict[str, Any], Path]:
    port = free_port()
    log = (work / "server.log").open("wb")
    trace = work / "serve_steps.json"
    server = launch(tree, trace, ["-m", "pagedserve", "serve", model, "--port", str(port), *SERVE],
                    stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        for _ in range(1200):
            if server.poll() is not None:
                raise RuntimeError(f"server exited: {(work / 'server.log').read_text()[-2000:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        load = [sys.executable, str(client), "--base-url", f"http://127.0.0.1:{port}/v1",
                "--server-kind", "pagedserve"]  # fmt: skip
        subprocess.run([*load, "--concurrency", "2", "--num-requests", "2", "--output-tokens",
                        "8", "--seed", "900"], check=True, capture_output=True)  # fmt: skip
        prompts = work / "prompts.jsonl"
        before, used_before = thread_cpu(server.pid), resource.getrusage(resource.RUSAGE_CHILDREN)
        others = Others()
        done = subprocess.run([*load, "--concurrency", "32", "--num-requests", str(num_requests),
                               "--prompt-tokens", "128", "--output-tokens", "128",
                               "--dump-prompts", str(prompts)],
                              check=True, capture_output=True, text=True)  # fmt: skip
        used, after = resource.getrusage(resource.RUSAGE_CHILDREN), thread_cpu(server.pid)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(120)
    report = json.loads(done.stdout)
    tokens = max(1, report["output_tokens_total"])
    client_s = used.ru_utime + used.ru_stime - used_before.ru_utime - used_before.ru_stime
    loop_s = after.get(server.pid, 0.0) - before.get(server.pid, 0.0)
    server_s = sum(after.values()) - sum(before.get(tid, 0.0) for tid in after)
    return {"tok_s": report["output_tok_per_s"], "loop_us_per_token": 1e6 * loop_s / tokens,
            "client_us_per_token": 1e6 * client_s / tokens,
            "others_cores": others.cores(server_s + client_s), **decode_steps(trace)}, prompts  # fmt: skip


def offline(tree: str, work: Path, prompts: Path) -> dict[str, Any]:
    trace = work / "offline_steps.json"
    args = ["-m", "bench.serving.serving_offline", "--prompts-jsonl", str(prompts),
            "--max-num-seqs", "32", "--output-tokens", "128", "--num-pages", "640"]  # fmt: skip
    used_before, others = resource.getrusage(resource.RUSAGE_CHILDREN), Others()
    proc = launch(tree, trace, args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    out, _ = proc.communicate()
    if proc.returncode:
        raise RuntimeError("serving_offline.py failed")
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    ours = used.ru_utime + used.ru_stime - used_before.ru_utime - used_before.ru_stime
    report = json.loads(out.decode().strip().splitlines()[-1])
    return {"tok_s": report["output_tok_per_s"], "others_cores": others.cores(ours),
            **decode_steps(trace)}  # fmt: skip


def one_run(name: str, tree: str, client: Path, model: str, a: argparse.Namespace,
            work: Path) -> dict[str, Any]:  # fmt: skip
    work.mkdir(parents=True, exist_ok=True)
    for _ in range(a.retries + 1):
        waited = wait_for_quiet(a.others_limit, a.patience)
        served, prompts = serve(tree, client, work, model, a.num_requests)
        off = offline(tree, work, prompts)
        disturbed = max(served["others_cores"], off["others_cores"]) >= a.others_limit
        if not disturbed:
            break
    row = {"build": name, "serving": served, "offline": off, "disturbed": disturbed,
           "others_before": waited, "ratio": served["tok_s"] / off["tok_s"],
           "load1": os.getloadavg()[0]}  # fmt: skip
    print(json.dumps(row), file=sys.stderr, flush=True)
    return row


def table(rows: list[dict[str, Any]], names: list[str]) -> str:
    lines = ["| figure (median) | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    figures = [("serving c32 output tok/s", lambda r: r["serving"]["tok_s"], 1),
               ("offline output tok/s", lambda r: r["offline"]["tok_s"], 1),
               ("serving / offline", lambda r: r["ratio"], 3),
               ("other processes' busy cores (serving run)",
                lambda r: r["serving"]["others_cores"], 2),
               ("event loop CPU us / token", lambda r: r["serving"]["loop_us_per_token"], 1),
               ("load generator CPU us / token", lambda r: r["serving"]["client_us_per_token"], 1),
               ("decode step (32 seqs), serving: model ms", lambda r: r["serving"]["model_ms"], 2),
               ("  rest of the step ms", lambda r: r["serving"]["rest_ms"], 2),
               ("  gap between steps ms", lambda r: r["serving"]["gap_ms"], 2),
               ("decode step (32 seqs), offline: model ms", lambda r: r["offline"]["model_ms"], 2),
               ("  rest of the step ms", lambda r: r["offline"]["rest_ms"], 2),
               ("  gap between steps ms", lambda r: r["offline"]["gap_ms"], 2)]  # fmt: skip
    for label, get, digits in figures:
        cells = []
        for name in names:
            values = []
            for row in rows:
                if row["build"] == name and not row["disturbed"]:
                    try:
                        values.append(float(get(row)))
                    except KeyError:
                        pass
            cells.append(f"{statistics.median(values):.{digits}f}" if values else "-")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from pagedserve.core.ops.cpu_features import cpu_model  # this checkout's, not a baseline's

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", required=True, help="a source tree with its _core module")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--num-requests",
        type=int,
        default=32,
        help="requests at --concurrency 32 (32: as compare.sh's quick grid)",
    )
    p.add_argument("--model", default="", help="default: the default model (resolve_model)")
    p.add_argument("--work", default=str(WORK / "serving_overhead"))
    p.add_argument(
        "--split",
        action="store_true",
        help="also the baseline server with this checkout's load generator",
    )
    p.add_argument(
        "--others-limit",
        type=float,
        default=0.3,
        help="a run where other processes kept this many cores busy is disturbed: "
        "waited for before (up to --patience s), retried, left out of medians",
    )
    p.add_argument("--patience", type=float, default=300.0)
    p.add_argument(
        "--synthetic-forward-ms",
        type=float,
        default=0.0,
        help="replace the model by a sleep this long (GIL released) that samples a "
        "constant token: the serving path's own cost, free of the model's noise",
    )
    p.add_argument("--retries", type=int, default=2)
    a = p.parse_args(argv)
    from pagedserve.core.models.resolve import resolve_model

    model = a.model or str(resolve_model("").path)
    if a.synthetic_forward_ms:
        os.environ["SYNTHETIC_FORWARD_S"] = str(a.synthetic_forward_ms / 1000)
    here, base = Path(__file__).with_name("serving.py"), Path(a.baseline) / "bench" / "serving.py"
    if not base.exists():  # a baseline tree with bench/ grouped in folders
        base = Path(a.baseline) / "bench" / "serving" / "serving.py"
    builds = {"baseline": (a.baseline, base if base.exists() else here)}
    if a.split:
        builds["baseline + this load generator"] = (a.baseline, here)
    builds["this checkout"] = ("", here)
    load_before = os.getloadavg()
    rows = []
    for repeat in range(a.repeats):
        order = list(builds.items()) if repeat % 2 == 0 else list(builds.items())[::-1]
        for name, (tree, client) in order:
            work = Path(a.work).resolve() / f"{repeat}-{name.replace(' ', '_')}"
            rows.append(one_run(name, tree, client, model, a, work))
    kept = sum(not row["disturbed"] for row in rows)
    print(f"CPU: {cpu_model()}; load average before {load_before}, after {os.getloadavg()}; "
          f"{a.repeats} repeats, builds alternating; {kept} of {len(rows)} runs undisturbed "
          f"(other processes under {a.others_limit} cores); baseline {a.baseline}"
          + (f"; model replaced by a {a.synthetic_forward_ms} ms sleep" if a.synthetic_forward_ms
             else ""))  # fmt: skip
    print(table(rows, list(builds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
