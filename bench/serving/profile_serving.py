"""Where a serving decode step's time goes: py-spy on a loaded pagedserve (issue 5).

    pip install py-spy
    python -m bench.serving.profile_serving                    # c=32, 128/128, 30 s of samples
    python -m bench.serving.profile_serving --summarize RAW    # re-read a kept py-spy raw file

Starts `pagedserve serve` on a free loopback port, drives it with bench/serving/serving.py, attaches
`py-spy record --format raw --threads` once the load is steady, and writes to bench/profiles/
a text summary (the raw collapsed stacks stay in bench/.work/) that sorts every sample into model forward,
attention, sampling, scheduling, detokenization, engine bookkeeping, and HTTP/SSE (+ event loop),
per thread, with the hottest leaf functions. A sample's category is the deepest frame that
matches a rule (attention inside the model counts as attention, not model forward).
"""

from __future__ import annotations

import argparse
import collections
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from bench.common import BENCH, WORK

PROFILES = BENCH / "profiles"
# (category, substrings of a frame "function (file:line)"); the deepest matching frame wins.
RULES: list[tuple[str, tuple[str, ...]]] = [
    ("HTTP/SSE", ("openai_compat/", "hypercorn/", "starlette/", "h11/", "orjson", "pydantic")),
    ("async engine handoff", ("async_engine.py",)),
    ("engine bookkeeping", ("core/engine/llm_engine.py", "core/request.py", "core/outputs.py")),
    ("scheduling", ("core/sched/scheduler.py", "core/sched/kv_cache.py")),
    ("model forward", ("core/models/", "model_runner.py")),  # torch frames never decide
    ("attention", ("core/attention/",)),
    ("sampling", ("core/sampling/sampler.py", "core/sampling/")),
    ("detokenization", ("detokenizer.py", "core/tokenizer", "tokenizers/")),
    ("model loading", ("loader_", "models/registry.py", "gguf/", "importlib")),
]
IDLE_LEAVES = ("select (selectors.py", "_run_once (asyncio", "wait (threading.py", "poll (")


def categorize(frames: list[str]) -> str:
    if frames and any(frames[-1].startswith(leaf) for leaf in IDLE_LEAVES):
        return "idle wait (event loop / queue)"
    category = "other"
    for frame in frames:
        for name, needles in RULES:
            if any(needle in frame for needle in needles):
                category = name
    return category


def summarize(raw: Path, top: int = 25) -> str:
    by_thread: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    leaves: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count, frames = int(count_text), stack.split(";")
        thread = frames[0] if frames[0].startswith(("thread", "process")) else "?"
        frames = [f for f in frames if not f.startswith(("thread", "process"))]
        by_thread[thread][categorize(frames)] += count
        leaves[frames[-1] if frames else "?"] += count
        total += count
    out = [f"py-spy samples: {total} (from {raw.name})", ""]
    for thread, counts in sorted(by_thread.items(), key=lambda kv: -sum(kv[1].values())):
        n = sum(counts.values())
        out.append(f"{thread}: {n} samples ({100 * n / max(1, total):.1f}% of all)")
        out += [f"  {100 * c / n:5.1f}%  {name}" for name, c in counts.most_common()]
        out.append("")
    out.append(f"hottest leaf frames (% of all samples), top {top}:")
    out += [f"  {100 * c / max(1, total):5.1f}%  {frame}" for frame, c in leaves.most_common(top)]
    return "\n".join(out) + "\n"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(port: int, log: Path, flags: list[str]) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "pagedserve", "serve", "--port", str(port), *flags]
    with log.open("wb") as out:  # from /tmp: the installed package, not the source folder
        proc = subprocess.Popen(cmd, cwd="/tmp", stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited:\n{log.read_text()}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError("server not ready after 600 s")


def profile(a: argparse.Namespace) -> Path:
    PROFILES.mkdir(exist_ok=True)
    work = WORK  # git-ignored: the raw stacks and the server log
    work.mkdir(exist_ok=True)
    raw = work / f"{a.name}.raw.txt"
    port = free_port()
    server = start_server(port, work / f"{a.name}.server.log", a.server_flags.split())
    load_cmd = [sys.executable, str(Path(__file__).with_name("serving.py")), "--base-url",
                f"http://127.0.0.1:{port}/v1", "--server-kind", "pagedserve",
                "--concurrency", str(a.concurrency), "--num-requests", str(a.num_requests),
                "--prompt-tokens", str(a.prompt_tokens), "--output-tokens", str(a.output_tokens),
                "--pid", str(server.pid)]  # fmt: skip
    load = subprocess.Popen(load_cmd, stdout=subprocess.DEVNULL)
    try:
        time.sleep(a.warmup)  # past calibration and the first prefills: steady decode
        subprocess.run(["py-spy", "record", "--pid", str(server.pid), "--duration",
                        str(a.seconds), "--rate", str(a.rate), "--format", "raw", "--threads",
                        "--nonblocking", "--output", str(raw)], check=True)  # fmt: skip
    finally:
        load.terminate()  # the samples are what we came for; the rest of the load is moot
        load.wait(60)
        server.send_signal(signal.SIGTERM)
        server.wait(60)
    return raw


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--summarize", type=Path, help="only summarize this py-spy raw file")
    p.add_argument("--name", default="serving_c32")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--num-requests", type=int, default=96)
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--output-tokens", type=int, default=128)
    p.add_argument("--warmup", type=float, default=20.0, help="seconds of load before sampling")
    p.add_argument("--seconds", type=int, default=30, help="seconds of sampling")
    p.add_argument("--rate", type=int, default=50, help="samples per second")
    p.add_argument("--server-flags", default="--num-pages 640 --max-num-seqs 64")
    a = p.parse_args(argv)
    raw = a.summarize or profile(a)
    text = summarize(raw)
    print(text)
    if not a.summarize:
        header = f"# {' '.join(sys.argv)}\n# load average: {os.getloadavg()}\n\n"
        (PROFILES / f"{a.name}.summary.txt").write_text(header + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
