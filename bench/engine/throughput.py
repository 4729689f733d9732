"""Offline throughput of pagedserve against transformers and llama.cpp, side by side (issue 3).

    python -m bench.engine.throughput            # full run: bf16 and fp32, 3 repeats (~15 min here)
    python -m bench.engine.throughput --quick    # small subset while developing (~1 min)
    python -m bench.engine.throughput --write    # also replace our section of bench/RESULTS-log.md

Figures, each the median over --repeats, engines interleaved within each repeat so that the
load of a shared machine falls on both alike:
- offline: 64 prompts x 128 output tokens (ignore_eos, greedy), output tokens/s of
  pagedserve's LLM.generate (all 64 at once) vs transformers' generate() on the same GGUF
  weights, same dtype, left padding, in batches of --hf-batch;
- prefill: a 1,000-token prompt with max_tokens=1 (time to the first token), prompt tokens/s,
  vs transformers and llama-bench's pp1000 on the Q4_1 file;
- decode: one request, 128 output tokens after a short prompt, tokens/s, vs transformers and
  llama-bench's tg128, with the bytes of weights each reads per token;
- for each dtype, so that dtype="auto" is chosen by measurement.
Prints one JSON object. The prefix cache is off so repeats measure real prefill.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from bench.common import BENCH, RESULTS_LOG, WORK

SECTION = "## Offline throughput (issue 3)"
NOTES = "### Notes"  # hand-written text under it, inside our section, survives --write
LLAMA_BIN = WORK / "llama.cpp-build" / "bin"
PAGE_SIZE = 16
FIGURES = ("offline", "prefill", "decode")
TARGETS = (
    "Targets (issue 3): offline >= 2x transformers; prefill >= 3x llama.cpp; single-request "
    "decode reported as it is, with the weight traffic per token that explains it."
)
MAX_PROMPT_TOKENS = 96
TOPICS = ("a lighthouse", "tea", "volcanoes", "chess", "bread", "birds", "jazz", "clocks")


@dataclass(frozen=True)
class Plan:
    num_prompts: int
    output_len: int
    prefill_len: int
    decode_len: int
    repeats: int
    hf_batch: int
    max_num_batched_tokens: int
    dtypes: tuple[str, ...]
    hf: bool
    llama_cpp: str  # "run" | "if-built" | "skip"
    threads: int


class Engine(Protocol):
    def generate(self, prompts: Sequence[list[int]], max_tokens: int) -> int:
        """Runs the prompts to exactly max_tokens each (greedy); returns tokens generated."""
        ...


class Ours:
    def __init__(self, dtype: str, plan: Plan) -> None:
        from pagedserve import LLM, SamplingParams

        pages_per_prompt = math.ceil((MAX_PROMPT_TOKENS + plan.output_len) / PAGE_SIZE)
        self.llm = LLM(
            "",
            dtype=dtype,
            max_model_len=max(plan.prefill_len, MAX_PROMPT_TOKENS) + plan.output_len,
            page_size=PAGE_SIZE,
            num_pages=plan.num_prompts * pages_per_prompt + plan.prefill_len // PAGE_SIZE + 16,
            max_num_seqs=max(plan.num_prompts, 1),
            max_num_batched_tokens=plan.max_num_batched_tokens,
            enable_prefix_caching=False,
        )
        self._params = SamplingParams
        self.model = self.llm.engine.model_runner.model

    def generate(self, prompts: Sequence[list[int]], max_tokens: int) -> int:
        params = self._params(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        outputs = self.llm.generate(list(prompts), params)
        return sum(len(o.outputs[0].token_ids) for o in outputs)


class Theirs:
    """transformers on the same GGUF (dequantized to dtype at load), greedy, left padding."""

    def __init__(self, gguf: Path, dtype: str, batch: int) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=getattr(torch, dtype)
        ).eval()
        self.batch = batch
        self.pad_id = 0  # masked out; any valid id will do

    @torch.inference_mode()
    def generate(self, prompts: Sequence[list[int]], max_tokens: int) -> int:
        total = 0
        for start in range(0, len(prompts), self.batch):
            input_ids, mask = self._left_pad(prompts[start : start + self.batch])
            out = self.model.generate(
                input_ids=input_ids,
                attention_mask=mask,
                do_sample=False,
                max_new_tokens=max_tokens,
                min_new_tokens=max_tokens,
                pad_token_id=self.pad_id,
            )
            total += (out.shape[1] - input_ids.shape[1]) * out.shape[0]
        return total

    def _left_pad(self, prompts: Sequence[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, p in enumerate(prompts):
            ids[row, width - len(p) :] = torch.tensor(p)
            mask[row, width - len(p) :] = 1
        return ids, mask


def weight_bytes_per_token(model: torch.nn.Module) -> int:
    """Bytes of weights one decode token reads: every linear layer's weight once (as packed for
    the native kernel, when it is, GGUF blocks kept quantized included; a tied lm_head reads the
    embedding whole), the norms; an input embedding is only gathered, one row per token."""
    from pagedserve.core.models.linear.dense import PackableLinear
    from pagedserve.core.models.linear.quantized import QuantizedGateUpLinear, QuantizedLinear

    kinds = (PackableLinear, QuantizedLinear, QuantizedGateUpLinear)
    linears = [m for m in model.modules() if isinstance(m, kinds)]
    in_linears = {id(p) for m in linears for p in m.parameters()}
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    rest = [p for p in model.parameters() if id(p) not in in_linears | embeddings]
    return sum(m.weight_bytes() for m in linears) + sum(p.numel() * p.element_size() for p in rest)


def gguf_bytes_per_token(path: Path) -> dict[str, int]:
    """The same count for llama.cpp on the GGUF file: tensors read as stored (Q4_1, Q8_0, F32);
    token_embd doubles as the output matrix when the file has no output.weight."""
    from gguf import GGUFReader

    tensors = GGUFReader(str(path)).tensors
    skip = {"token_embd.weight"} if any(t.name == "output.weight" for t in tensors) else set()
    by_type: dict[str, int] = {}
    for t in tensors:
        if t.name not in skip:
            by_type[t.tensor_type.name] = by_type.get(t.tensor_type.name, 0) + int(t.n_bytes)
    return {"total": sum(by_type.values()), **by_type}


def make_prompts(encode: Callable[[str], list[int]], n: int) -> list[list[int]]:
    prompts = []
    for i in range(n):
        topic = TOPICS[i % len(TOPICS)]
        text = f"Request {i}. Write a detailed essay about {topic}, with an introduction, " + (
            "three sections and a conclusion. " * (1 + i % 3)
        )
        prompts.append(encode(text)[:MAX_PROMPT_TOKENS])
    return prompts


def long_prompt(length: int, seed: int) -> list[int]:
    """Random ordinary tokens (ids 1000-40000 are plain BPE pieces in this vocabulary)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(1000, 40000, (length,), generator=gen).tolist()


def timed(engine: Engine, prompts: Sequence[list[int]], max_tokens: int) -> tuple[float, int]:
    start = time.perf_counter()
    n = engine.generate(prompts, max_tokens)
    return time.perf_counter() - start, n


def run_once(engine: Engine, prompts: list[list[int]], long: list[int], plan: Plan) -> dict:
    """One repeat of the three figures on one engine, in tokens/s. Every run must produce all of
    its tokens: a request that failed early would otherwise read as a fast one."""

    def run(batch: Sequence[list[int]], max_tokens: int) -> float:
        seconds, n = timed(engine, batch, max_tokens)
        if n != len(batch) * max_tokens:
            raise RuntimeError(
                f"{type(engine).__name__} generated {n} of {len(batch) * max_tokens} tokens"
            )
        return seconds

    offline = len(prompts) * plan.output_len / run(prompts, plan.output_len)
    prefill = len(long) / run([long], 1)
    decode = plan.decode_len / run(prompts[:1], plan.decode_len)
    return {"offline": offline, "prefill": prefill, "decode": decode}


def load_engines(plan: Plan, gguf: Path) -> dict[tuple[str, str], Engine]:
    engines: dict[tuple[str, str], Engine] = {}
    for dtype in plan.dtypes:
        engines[dtype, "pagedserve"] = Ours(dtype, plan)
        if plan.hf:
            engines[dtype, "transformers"] = Theirs(gguf, dtype, plan.hf_batch)
    return engines


def measure(plan: Plan, gguf: Path) -> dict[str, Any]:
    """Every (dtype, engine) loaded at once and run in turn within each repeat, so that the load
    of a shared machine falls on all alike. Each repeat's figures go to stderr as they come."""
    engines = load_engines(plan, gguf)
    ours = engines[plan.dtypes[0], "pagedserve"]
    assert isinstance(ours, Ours)
    prompts = make_prompts(lambda s: list(ours.llm.tokenizer.encode(s)), plan.num_prompts)
    for engine in engines.values():  # warm-up: both shapes, untimed
        engine.generate(prompts[:4], 4)
        engine.generate([long_prompt(plan.prefill_len, -1)], 1)
    samples: dict[tuple[str, str], list[dict[str, float]]] = {key: [] for key in engines}
    for rep in range(plan.repeats):
        long = long_prompt(plan.prefill_len, rep)  # a fresh prompt per repeat
        for (dtype, name), engine in engines.items():
            figs = run_once(engine, prompts, long, plan)
            samples[dtype, name].append(figs)
            progress = {"repeat": rep, "dtype": dtype, "engine": name, "load": os.getloadavg()}
            print(json.dumps(progress | {k: round(v, 1) for k, v in figs.items()}), file=sys.stderr)
    result: dict[str, Any] = {}
    for (dtype, name), runs in samples.items():
        figures = {fig: summary([s[fig] for s in runs]) for fig in FIGURES}
        result.setdefault(dtype, {})[name] = figures
        if isinstance(model_owner := engines[dtype, name], Ours):
            figures["weight_bytes_per_token"] = weight_bytes_per_token(model_owner.model)
    return result


def summary(values: list[float]) -> dict[str, Any]:
    return {"median": round(statistics.median(values), 1), "samples": [round(v, 1) for v in values]}


def llama_bench(gguf: Path, plan: Plan) -> dict[str, Any] | None:
    """llama-bench's pp<prefill_len> and tg<decode_len> on the GGUF, --threads threads."""
    if plan.llama_cpp == "skip":
        return None
    binary = LLAMA_BIN / "llama-bench"
    if not binary.exists():
        if plan.llama_cpp == "if-built":
            return None
        subprocess.run([str(BENCH / "serving" / "build_llama_cpp.sh")], check=True)
    cmd = [
        str(binary),
        "-m",
        str(gguf),
        "-p",
        str(plan.prefill_len),
        "-n",
        str(plan.decode_len),
        "-t",
        str(plan.threads),
        "-r",
        str(plan.repeats),
        "-o",
        "json",
    ]
    tests = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    out: dict[str, Any] = {"command": " ".join(["llama-bench", *cmd[1:]])}
    for t in tests:
        key = "prefill" if t["n_gen"] == 0 else "decode"
        out[key] = summary(t["samples_ts"])
        out["build"] = f"{t['build_commit']} ({t['cpu_info']})"
    print(json.dumps({"llama_cpp": out}), file=sys.stderr)
    return out


def ratio(a: dict[str, Any] | None, b: dict[str, Any] | None) -> float | None:
    return round(a["median"] / b["median"], 2) if a and b else None


def add_ratios(report: dict[str, Any]) -> None:
    lcpp = report["llama_cpp"] or {}
    for figs in report["dtypes"].values():
        ours, theirs = figs["pagedserve"], figs.get("transformers", {})
        figs["ratios"] = {
            f"{fig}_vs_{peer}": ratio(ours[fig], peer_figs.get(fig))
            for fig in FIGURES
            for peer, peer_figs in (("transformers", theirs), ("llama_cpp", lcpp))
            if peer_figs.get(fig)
        }
        decode = ours["decode"]["median"]
        figs["pagedserve"]["weight_read_gb_per_s"] = round(
            ours["weight_bytes_per_token"] * decode / 1e9, 1
        )


def render_section(r: dict[str, Any]) -> str:
    p, lcpp = r["plan"], r["llama_cpp"] or {}
    lines = [SECTION, "", header(r), "", *table(r, p, lcpp)]
    lines += ["", TARGETS, "", traffic_line(r), ""]
    if dtype := dtype_line(r):
        lines += [dtype, ""]
    return "\n".join(lines)


def header(r: dict[str, Any]) -> str:
    p, lcpp = r["plan"], r["llama_cpp"] or {}
    return (
        f"Measured {r['date']} with `python -m bench.engine.throughput --write`: torch {r['torch']}, "
        f"{r['threads']} threads, medians of {p['repeats']} repeats, engines interleaved; "
        f"load average (1/5/15 min) {fmt_load(r['load_avg_before'])} before, "
        f"{fmt_load(r['load_avg_after'])} after (2 cores shared with other work). "
        f"Model {r['model']}. pagedserve: all {p['num_prompts']} requests at once, "
        f"max_num_batched_tokens {p['max_num_batched_tokens']}, prefix cache off. "
        f"transformers: generate() on the same GGUF, batches of {p['hf_batch']}, left padding, "
        f"greedy, min_new_tokens = max_new_tokens. llama.cpp: `{lcpp.get('command', 'not run')}`."
    )


def table(r: dict[str, Any], p: dict[str, Any], lcpp: dict[str, Any]) -> list[str]:
    lines = [
        "| figure | dtype | pagedserve | transformers | llama.cpp (Q4_1) | vs transformers "
        "| vs llama.cpp |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    names = {
        "offline": f"offline {p['num_prompts']} x {p['output_len']} tokens, output tok/s",
        "prefill": f"prefill {p['prefill_len']}-token prompt, tok/s (to first token)",
        "decode": f"decode, 1 request x {p['decode_len']} tokens, tok/s",
    }
    for fig, name in names.items():
        for dtype, figs in r["dtypes"].items():
            theirs, ratios = figs.get("transformers", {}).get(fig), figs["ratios"]
            lines.append(
                f"| {name} | {dtype} | {figs['pagedserve'][fig]['median']} "
                f"| {theirs['median'] if theirs else '-'} "
                f"| {lcpp[fig]['median'] if fig in lcpp else '-'} "
                f"| {fmt_ratio(ratios.get(f'{fig}_vs_transformers'))} "
                f"| {fmt_ratio(ratios.get(f'{fig}_vs_llama_cpp'))} |"
            )
    return lines


def dtype_line(r: dict[str, Any]) -> str | None:
    """bf16 against fp32 for pagedserve: the measurement behind dtype="auto" on this CPU."""
    figs = r["dtypes"]
    if not {"bfloat16", "float32"} <= figs.keys():
        return None
    bf16, fp32 = figs["bfloat16"]["pagedserve"], figs["float32"]["pagedserve"]
    speedups = ", ".join(f"{fig} {ratio(bf16[fig], fp32[fig])}x" for fig in FIGURES)
    return f'dtype="auto" on this CPU: pagedserve bfloat16 / float32 = {speedups}.'


def traffic_line(r: dict[str, Any]) -> str:
    g = r["gguf_bytes_per_token"]
    parts = [
        f"{d}: {f['pagedserve']['weight_bytes_per_token'] / 1e6:.0f} MB/token, at "
        f"{f['pagedserve']['decode']['median']} tok/s = "
        f"{f['pagedserve']['weight_read_gb_per_s']} GB/s"
        for d, f in r["dtypes"].items()
    ]
    lcpp = (r["llama_cpp"] or {}).get("decode")
    quant = ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in g.items() if k != "total")
    lcpp_rate = (
        f", at {lcpp['median']} tok/s = {g['total'] * lcpp['median'] / 1e9:.1f} GB/s"
        if lcpp
        else ""
    )
    return (
        "Weights read per decoded token (every matrix once; the tied embedding is the lm_head): "
        + "; ".join(parts)
        + f". llama.cpp on the GGUF: {g['total'] / 1e6:.1f} MB/token ({quant}){lcpp_rate}."
    )


def fmt_load(load: Sequence[float]) -> str:
    return "/".join(f"{x:.1f}" for x in load)


def fmt_ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def write_section(path: Path, report: dict[str, Any]) -> None:
    """Replaces our section (up to the next '## ' heading; our '### Notes' are kept) or appends it."""
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    before, found, rest = text.partition(SECTION + "\n")
    if not found:
        before, rest = text.rstrip("\n") + "\n\n", ""
    end = rest.find("\n## ")
    old, after = (rest[: end + 1], rest[end + 1 :]) if end >= 0 else (rest, "")
    notes = old[old.find(NOTES) :].rstrip("\n") + "\n" if NOTES in old else ""
    new = render_section(report) + ("\n" + notes if notes else "")
    path.write_text(before + new + ("\n" + after if after else ""))


def parse_args() -> tuple[Plan, bool]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a small subset for development")
    ap.add_argument(
        "--write", action="store_true", help="replace our section of bench/RESULTS-log.md"
    )
    ap.add_argument("--repeats", type=int, help="repeats per figure (default 3; quick 1)")
    ap.add_argument("--dtypes", help="comma-separated (default bfloat16,float32; quick bfloat16)")
    ap.add_argument("--hf-batch", type=int, default=64, help="transformers batch size")
    ap.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=512,
        help="pagedserve's token budget per step (engine default 512)",
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-transformers", action="store_true")
    ap.add_argument(
        "--llama-cpp",
        choices=("run", "if-built", "skip"),
        help="run (build if needed; the default), if-built (quick's default), skip",
    )
    args = ap.parse_args()
    quick = args.quick
    plan = Plan(
        num_prompts=8 if quick else 64,
        output_len=32 if quick else 128,
        prefill_len=256 if quick else 1000,
        decode_len=32 if quick else 128,
        repeats=args.repeats or (1 if quick else 3),
        hf_batch=min(args.hf_batch, 8) if quick else args.hf_batch,
        max_num_batched_tokens=args.max_num_batched_tokens,
        dtypes=tuple((args.dtypes or ("bfloat16" if quick else "bfloat16,float32")).split(",")),
        hf=not args.no_transformers,
        llama_cpp=args.llama_cpp or ("if-built" if quick else "run"),
        threads=args.threads,
    )
    if plan.repeats < 1 or plan.hf_batch < 1 or plan.threads < 1:
        ap.error("--repeats, --hf-batch and --threads must be >= 1")
    return plan, args.write


def main() -> None:
    plan, write = parse_args()
    torch.set_num_threads(plan.threads)
    from pagedserve.core.models.resolve import resolve_model
    from pagedserve.core.ops.cpu_features import cpu_model

    gguf = resolve_model("").path
    report: dict[str, Any] = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "load_avg_before": os.getloadavg(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "cpu": cpu_model() or platform.machine(),
        "model": gguf.name,
        "plan": asdict(plan),
        "gguf_bytes_per_token": gguf_bytes_per_token(gguf),
        "llama_cpp": llama_bench(gguf, plan),
        "dtypes": measure(plan, gguf),
    }
    report["load_avg_after"] = os.getloadavg()
    add_ratios(report)
    print(json.dumps(report, indent=1))
    if write:
        write_section(RESULTS_LOG, report)


if __name__ == "__main__":
    main()
