"""Speculative decoding on the serving path (issue 26): output tok/s with speculation off vs
ngram, side by side in one run, on three chat workloads:

- editing: a function of this repository (25-45 lines) to rewrite with one rename;
- summarization: ~1k tokens of docs/design.md pasted, to summarize;
- free: short stories on a few topics (little to copy from the prompt);

at c=1 on each, and at c=8 and c=32 on editing and free text (where speculation has to back
off). Both servers run at once on free loopback ports (same flags but the speculation ones) and
are measured alternately, ABAB, --repeats times; each cell is the median. Greedy, natural
lengths (up to --max-tokens), streaming, through bench/serving/serving.py. Prints one JSON object
(and a Markdown table with --table). Run it under the bench lock:

    flock /tmp/pagedserve-bench.lock python -m bench.serving.spec_decode --repeats 3 --table

--draft-model PATH adds a server with `--speculative-method draft --speculative-model PATH` (e.g.
bench/engine/layer_draft.py's cut of the target's first layers: no smaller model with SmolLM2's
tokenizer reaches these machines), and --llama-bin DIR (bench/serving/build_llama_cpp.sh's bin folder) adds llama.cpp's llama-server on the same
GGUF (2 threads, one slot) without speculation, with its prompt lookup (`--spec-type
ngram-simple`) at its defaults (a 12-token match, drafts up to 48) and with lookup sized as ours
(a 3-token match, up to 4 drafted tokens), measured in the same rounds, at c=1 only; with
--draft-model too, llama-server with the same draft (`-md PATH --spec-type draft-simple`, up to 4
drafted tokens). --c1: the c=1 cases only.
"""

from __future__ import annotations

import argparse
import inspect
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import ROOT
from bench.serving.serving import Options, run, run_loop

CONFIGS = {"off": [], "ngram": ["--speculative-method", "ngram"]}
# llama-server's configs (--llama-bin): off, its prompt lookup at its defaults, and one sized as
# ours (a 3-token match, up to 4 drafted tokens).
LLAMA_CONFIGS = {
    "llama": [],
    "llama-ngram": ["--spec-type", "ngram-simple"],
    "llama-ngram-4": ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3",
                      "--spec-ngram-simple-size-m", "4", "--spec-draft-n-max", "4"],
}  # fmt: skip
RENAMES = [("seq", "sequence"), ("plan", "step_plan"), ("request", "req"), ("params", "options")]


def _functions() -> list[str]:
    from pagedserve.core.engine import admission, output_processor
    from pagedserve.core.engine import llm_engine as engine
    from pagedserve.core.runner import model_runner

    picked: list[Callable[..., Any]] = [
        output_processor.OutputProcessor._append_token,
        engine.LLMEngine._add_sequence,
        model_runner.ModelRunner._sampling_batch,
        admission.resolve_max_tokens,
    ]
    return [textwrap.dedent(inspect.getsource(f)) for f in picked]


def workloads() -> dict[str, list[str]]:
    editing = [
        f"Here is a Python function:\n\n```python\n{code}```\n\nRewrite the whole function "
        f"with one change: rename `{old}` to `{new}` everywhere. Output only the code."
        for code, (old, new) in zip(_functions(), RENAMES, strict=True)
    ]
    text = (ROOT / "docs" / "design.md").read_text()
    context = [text[start : start + 4200] for start in (0, 4200, 8400, 12600)]
    summaries = [
        f"{chunk}\n\nSummarize the text above in a few sentences, keeping its key terms."
        for chunk in context
    ]
    topics = ["a lighthouse keeper", "a lost dog in a big city", "the first day at a new job",
              "a storm at sea"]  # fmt: skip
    free = [f"Write a short story about {topic}." for topic in topics]
    return {"editing": editing, "summarization": summaries, "free": free}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(name: str, flags: list[str], log_dir: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    command = [sys.executable, "-m", "pagedserve", "serve", "--port", str(port),
               "--num-pages", "2048", "--max-num-seqs", "64", "--max-model-len", "4096", *flags]  # fmt: skip
    return launch(name, command, port, log_dir)


def start_llama(
    name: str, bin_dir: Path, flags: list[str], log_dir: Path
) -> tuple[subprocess.Popen[bytes], str]:
    """llama-server on the default GGUF: 2 threads, one slot of 8k tokens (c=1 only)."""
    from pagedserve.core.models.resolve import resolve_model

    port = free_port()
    command = [str(bin_dir.resolve() / "llama-server"), "-m", str(resolve_model("").path), "--host",
               "127.0.0.1", "--port", str(port), "-np", "1", "-c", "8192", "-t", "2", "-tb", "2",
               "--cache-ram", "0", "--no-webui", *flags]  # fmt: skip
    return launch(name, command, port, log_dir)


def launch(
    name: str, command: list[str], port: int, log_dir: Path
) -> tuple[subprocess.Popen[bytes], str]:
    log = (log_dir / f"{name}.log").open("wb")
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=log_dir)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        if proc.poll() is not None:
            raise RuntimeError(f"{name} died: {(log_dir / f'{name}.log').read_text()[-2000:]}")
        try:
            urllib.request.urlopen(url + "/health", timeout=2)
            return proc, url + "/v1"
        except OSError:
            time.sleep(1)
    raise RuntimeError(f"{name}: not ready after 600 s")


def one_case(base_url: str, prompts_file: Path, concurrency: int, num: int, max_tokens: int,
             pid: int) -> dict[str, Any]:  # fmt: skip
    opts = Options(base_url=base_url, model="", api_key="", server_kind="openai", endpoint="chat",
                   concurrency=concurrency, request_rate=0.0, num_requests=num,
                   max_seconds=1200.0, prompt_tokens=1, output_tokens=max_tokens,
                   prompts_jsonl=str(prompts_file), dump_prompts="", shared_prefix=False,
                   pid=pid, seed=0, temperature=0.0, timeout=1200.0)  # fmt: skip
    result: dict[str, Any] = run_loop(run(opts))
    return result


def metrics_text(base_url: str) -> dict[str, float]:
    body = urllib.request.urlopen(base_url.removesuffix("/v1") + "/metrics").read().decode()
    found = {}
    for line in body.splitlines():
        if line.startswith("vllm:spec_decode_num_") and "per_pos" not in line:
            name, value = line.split("{")[0], float(line.rsplit(" ", 1)[1])
            found[name.removeprefix("vllm:spec_decode_").removesuffix("_total")] = value
    return found


def cases(quick: bool) -> list[tuple[str, int, int]]:
    """(workload, concurrency, requests)."""
    grid = [("editing", 1, 4), ("summarization", 1, 4), ("free", 1, 4)]
    grid += [("editing", 8, 8), ("free", 8, 8), ("editing", 32, 32), ("free", 32, 32)]
    return [(w, c, max(c, 2) if quick else n) for w, c, n in grid]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=320)
    p.add_argument("--quick", action="store_true", help="fewer requests per case")
    p.add_argument("--table", action="store_true", help="also print a Markdown table")
    p.add_argument("--uncapped", action="store_true",
                   help="a third server: ngram with --speculative-max-batch 64 (the rule alone)")  # fmt: skip
    p.add_argument("--llama-bin", type=Path, default=None,
                   help="llama.cpp's bin folder: llama-server off / lookup beside ours at c=1")  # fmt: skip
    p.add_argument("--c1", action="store_true", help="the c=1 cases only")
    p.add_argument("--draft-model", default="",
                   help="a draft model's path: a server with --speculative-method draft")  # fmt: skip
    args = p.parse_args()
    configs = dict(CONFIGS)
    if args.draft_model:
        configs["draft"] = ["--speculative-method", "draft", "--speculative-model",
                            str(Path(args.draft_model).resolve())]  # fmt: skip
    if args.uncapped:
        configs["ngram64"] = [*CONFIGS["ngram"], "--speculative-max-batch", "64"]
    work = Path(tempfile.mkdtemp(prefix="spec_decode_"))
    files = {}
    for name, prompts in workloads().items():
        files[name] = work / f"{name}.jsonl"
        files[name].write_text("".join(json.dumps({"prompt": x}) + "\n" for x in prompts))
    servers = {name: start_server(name, flags, work) for name, flags in configs.items()}
    if args.llama_bin:
        llama_configs = dict(LLAMA_CONFIGS)
        if args.draft_model:
            llama_configs["llama-draft"] = ["-md", str(Path(args.draft_model).resolve()),
                                            "--spec-type", "draft-simple",
                                            "--spec-draft-n-max", "4"]  # fmt: skip
        for name, flags in llama_configs.items():
            servers[name] = start_llama(name, args.llama_bin, flags, work)
    results: dict[str, dict[str, list[float]]] = {}
    try:
        for _proc, url in servers.values():  # warm-up: one short request each
            one_case(url, files["free"], 1, 1, 8, 0)
        for _ in range(args.repeats):
            for workload, c, num in cases(args.quick):
                if args.c1 and c > 1:
                    continue
                key = f"{workload} c={c}"
                for name, (proc, url) in servers.items():
                    if name.startswith("llama") and c > 1:
                        continue  # one slot: the c=1 comparison only
                    out = one_case(url, files[workload], c, num, args.max_tokens, proc.pid)
                    results.setdefault(key, {}).setdefault(name, []).append(out["output_tok_per_s"])
                    print(
                        json.dumps(
                            {
                                "case": key,
                                "server": name,
                                "tok_s": out["output_tok_per_s"],
                                "tokens": out["output_tokens_total"],
                            }
                        ),  # fmt: skip
                        file=sys.stderr,
                        flush=True,
                    )
        spec_counters = {name: metrics_text(servers[name][1])
                         for name in ("ngram", "draft") if name in servers}  # fmt: skip
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(timeout=60)
    report = {
        "cpu": cpu_model(),
        "repeats": args.repeats,
        "median_output_tok_per_s": {
            key: {name: statistics.median(v) for name, v in by.items()}
            for key, by in results.items()
        },
        "spec_counters": spec_counters,
    }
    for by in report["median_output_tok_per_s"].values():
        for name in [n for n in by if n != "off"]:
            by[f"{name}/off"] = round(by[name] / by["off"], 3) if by["off"] else 0.0
    print(json.dumps(report, indent=1))
    if args.table:
        print(table(report))


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def table(report: dict[str, Any]) -> str:
    first = next(iter(report["median_output_tok_per_s"].values()))
    names = [n for n in first if "/" not in n]
    ratios = [n for n in first if "/" in n]
    rows = ["| case | " + " | ".join(f"{n} tok/s" for n in names) + " | " + " | ".join(ratios)
            + " |", "| --- " * (1 + len(names) + len(ratios)) + "|"]  # fmt: skip
    for key, by in report["median_output_tok_per_s"].items():
        cells = [f"{by[n]:.1f}" if n in by else "-" for n in names]
        cells += [f"{by[r]:.2f}x" if r in by else "-" for r in ratios]
        rows.append(f"| {key} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


if __name__ == "__main__":
    main()
