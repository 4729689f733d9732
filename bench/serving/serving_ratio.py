"""Serving / offline output tok/s at c=32 (issue 5's "HTTP overhead" figure), measured in
alternating waves so that the machine's drift falls on both sides of each ratio.

    python -m bench.serving.serving_ratio --pairs 8                    # this checkout
    python -m bench.serving.serving_ratio --pairs 8 --tree /tmp/base   # and a baseline tree, interleaved

Measured the simple way (a server run, then an offline run minutes later) the ratio swings by
+-15% on these shared machines: the same offline run moves 800-1,170 tok/s within minutes. Here,
per tree, one `pagedserve serve` and one offline engine (`LLM.generate` in a worker process)
stay loaded side by side, idle in turn, and each pair is a serving wave (bench/serving/serving.py at
--concurrency 32: --num-requests prompts of --prompt-tokens, --output-tokens out, greedy,
ignore_eos) next to an offline wave on the same prompts (max_num_seqs 32), their order
alternating pair by pair. Both run without the prefix cache, so every wave computes every
prompt. Reported per tree: the median of the pairs' ratios with their range, the median tok/s
of each side, the CPU model and the load averages. The load generator shares the cores with the
server, as in bench/serving/compare.sh.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

import httpx

from bench.common import ROOT, WORK, in_tree
from bench.common.server import free_port

NUM_PAGES = 640  # compare.sh's short grid: 32 slots x (128 + 128 + 64) tokens / 16


def offline_worker(argv: list[str]) -> int:
    """A tree's offline engine, loaded once (bench.common.in_tree loaded its pagedserve): one JSON
    command per stdin line ({"prompts": path, "output_tokens": n}), one JSON answer per stdout
    line; "ready" once loaded. argv: the KV pages."""
    from pagedserve import LLM, SamplingParams

    llm = LLM(max_num_seqs=32, num_pages=int(argv[0]), enable_prefix_caching=False)
    llm.generate(["warm up"] * 2, SamplingParams(temperature=0, max_tokens=4))
    print("ready", flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        prompts = [json.loads(p)["prompt"] for p in Path(command["prompts"]).read_text().split("\n")
                   if p.strip()]  # fmt: skip
        params = SamplingParams(temperature=0, max_tokens=command["output_tokens"], ignore_eos=True)
        start = time.perf_counter()
        outputs = llm.generate(prompts, params)
        seconds = time.perf_counter() - start
        tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
        print(json.dumps({"output_tok_per_s": tokens / seconds, "output_tokens": tokens}),
              flush=True)  # fmt: skip
    return 0


class Tree:
    """One build's server and offline engine, both loaded for the whole run."""

    def __init__(self, name: str, path: str, model: str, work: Path) -> None:
        self.name, self.work = name, work
        work.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        serve = [model, "--port", str(self.port), "--num-pages", str(NUM_PAGES),
                 "--max-num-seqs", "64", "--max-model-len", "2048", "--no-enable-prefix-caching"]  # fmt: skip
        # Each in its own process with the tree's pagedserve (bench/common/in_tree.py).
        self.server = self._start(path, ["-m", "pagedserve", "serve", *serve], "server.log")
        self.offline = self._start(path, ["bench.serving.serving_ratio:offline_worker",
                                          str(NUM_PAGES)], "offline.log", pipes=True)  # fmt: skip
        self.ratios: list[float] = []
        self.served: list[float] = []
        self.offline_tok_s: list[float] = []

    def _start(self, tree: str, target: list[str], log: str,
               pipes: bool = False) -> subprocess.Popen[str]:  # fmt: skip
        err: IO[str] = (self.work / log).open("w")
        return subprocess.Popen(
            in_tree(tree, *target), cwd=ROOT, text=True,
            stdin=subprocess.PIPE if pipes else subprocess.DEVNULL,
            stdout=subprocess.PIPE if pipes else err, stderr=err,
        )  # fmt: skip

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def wait_ready(self, timeout_s: float = 600) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.server.poll() is not None:
                raise RuntimeError(f"{self.name}: server exited (see {self.work}/server.log)")
            try:
                if httpx.get(self.url.removesuffix("/v1") + "/health", timeout=2).is_success:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: server not ready after {timeout_s} s")
            time.sleep(0.5)
        assert self.offline.stdout is not None
        if self.offline.stdout.readline().strip() != "ready":
            raise RuntimeError(f"{self.name}: offline worker failed (see {self.work}/offline.log)")

    def serve_wave(self, args: list[str]) -> dict[str, Any]:
        cmd = [sys.executable, str(Path(__file__).with_name("serving.py")), "--base-url", self.url,
               "--server-kind", "pagedserve", *args]  # fmt: skip
        done = subprocess.run(cmd, check=True, capture_output=True, text=True)
        report: dict[str, Any] = json.loads(done.stdout)
        return report

    def offline_wave(self, prompts: Path, output_tokens: int) -> float:
        assert self.offline.stdin is not None and self.offline.stdout is not None
        self.offline.stdin.write(json.dumps({"prompts": str(prompts),
                                             "output_tokens": output_tokens}) + "\n")  # fmt: skip
        self.offline.stdin.flush()
        line = self.offline.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.name}: offline worker died (see {self.work}/offline.log)")
        return float(json.loads(line)["output_tok_per_s"])

    def close(self) -> None:
        if self.offline.stdin is not None:
            self.offline.stdin.close()
        self.server.terminate()
        for proc in (self.offline, self.server):
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()


def one_pair(tree: Tree, prompts: Path, a: argparse.Namespace, serving_first: bool) -> None:
    wave = ["--concurrency", "32", "--num-requests", str(a.num_requests),
            "--prompts-jsonl", str(prompts), "--output-tokens", str(a.output_tokens)]  # fmt: skip
    if serving_first:
        served = tree.serve_wave(wave)["output_tok_per_s"]
        offline = tree.offline_wave(prompts, a.output_tokens)
    else:
        offline = tree.offline_wave(prompts, a.output_tokens)
        served = tree.serve_wave(wave)["output_tok_per_s"]
    tree.served.append(served)
    tree.offline_tok_s.append(offline)
    tree.ratios.append(served / offline)
    print(f"{tree.name}: serving {served:.1f} offline {offline:.1f} tok/s = "
          f"{served / offline:.3f}", file=sys.stderr, flush=True)  # fmt: skip


def table(trees: list[Tree]) -> str:
    lines = ["| tree | pairs | serving / offline: median (min - max) | serving tok/s | "
             "offline tok/s |", "|---|---:|---|---:|---:|"]  # fmt: skip
    for t in trees:
        lines.append(
            f"| {t.name} | {len(t.ratios)} | **{statistics.median(t.ratios):.3f}** "
            f"({min(t.ratios):.3f} - {max(t.ratios):.3f}) | {statistics.median(t.served):.1f} | "
            f"{statistics.median(t.offline_tok_s):.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from pagedserve.core.models.resolve import resolve_model
    from pagedserve.core.ops.cpu_features import cpu_model

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=8, help="serving + offline waves per tree")
    p.add_argument("--num-requests", type=int, default=64, help="prompts per wave (32 at once)")
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--output-tokens", type=int, default=128)
    p.add_argument("--tree", action="append", default=[], metavar="PATH",
                   help="also a baseline source tree with its _core module (repeatable)")  # fmt: skip
    p.add_argument("--model", default="", help="default: the default model (resolve_model)")
    p.add_argument("--work", default=str(WORK / "serving_ratio"))
    p.add_argument(
        "--json", help="also write the figures here (bench/serving/compare_report.py reads it)"
    )
    a = p.parse_args(argv)
    model = a.model or str(resolve_model("").path)
    work = Path(a.work).resolve()
    load_before = os.getloadavg()
    named = [("this checkout", ""), *((f"tree {path}", path) for path in a.tree)]
    trees = [Tree(name, path, model, work / f"tree{i}") for i, (name, path) in enumerate(named)]
    try:
        for tree in trees:
            tree.wait_ready()
        prompts = work / "prompts.jsonl"  # made (and every server warmed) by a first wave
        for tree in trees:
            tree.serve_wave(["--concurrency", "32", "--num-requests", str(a.num_requests),
                             "--prompt-tokens", str(a.prompt_tokens), "--output-tokens", "8",
                             "--dump-prompts", str(prompts)])  # fmt: skip
        for pair in range(a.pairs):
            for tree in trees if pair % 2 == 0 else trees[::-1]:
                one_pair(tree, prompts, a, serving_first=pair % 2 == 0)
    finally:
        for tree in trees:
            tree.close()
    print(f"CPU: {cpu_model()}; load average before {load_before}, after {os.getloadavg()}; "
          f"{a.pairs} pairs per tree, c=32, {a.num_requests} prompts of {a.prompt_tokens} tokens x "
          f"{a.output_tokens} out per wave, prefix cache off")  # fmt: skip
    print(table(trees))
    if a.json:
        figures = {t.name: {"pairs": len(t.ratios), "ratio_median": statistics.median(t.ratios),
                            "ratio_min": min(t.ratios), "ratio_max": max(t.ratios),
                            "serving_tok_s": statistics.median(t.served),
                            "offline_tok_s": statistics.median(t.offline_tok_s)}
                   for t in trees}  # fmt: skip
        Path(a.json).write_text(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
