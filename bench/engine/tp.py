"""Tensor parallelism on this machine's CPU: offline throughput at TP=1 vs TP=2, and the time
rank 0 spends in the step's collectives (issue 14).

    python -m bench.engine.tp                 # bf16, 3 repeats (a few minutes here)
    python -m bench.engine.tp --quick         # a smoke run

The model is a random Llama (hidden 512, 8 query / 4 KV heads of 64, MLP 1536, 16 layers;
the tiny BPE vocabulary of the tests, 400 tokens, so the lm_head gather is small) written
once to a temporary folder. Each measurement runs in a fresh child process (TP=2 sets the
process's torch threads to its share of the cores, which would leak into a TP=1 engine in the
same process), TP=1 and TP=2 alternating within each repeat so a shared machine's load falls on
both; figures are medians over the repeats. Both use the same cores: TP=1 runs one process with
every core, TP=2 two processes with half each, so no speed-up is expected here; the point is
the cost of the split. `collective ms/step` is rank 0's wall time inside the all-reduces, the
logits gather and the step arrays' broadcast (waits for the slower rank included), per engine
step.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench.common import ROOT
from pagedserve.core.ops.cpu_features import cpu_model

SHAPE = dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=16,
             num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=512,
             rms_norm_eps=1e-5)  # fmt: skip
PROMPT_LEN = 32
# (label, tensor_parallel_size, torch threads per rank; 0 = the engine's own choice)
CONFIGS = [("1", 1, 0), ("1 (1 thread)", 1, 1), ("2", 2, 0)]


def write_model(folder: Path) -> None:
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from bench.common.tiny_tokenizers import write_tiny_bpe

    write_tiny_bpe(folder)
    vocab = len(AutoTokenizer.from_pretrained(folder))
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=vocab, **SHAPE)).to(torch.bfloat16)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02)
    model.save_pretrained(folder)


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One engine at args.tp: warm up, then one timed offline run."""
    from pagedserve import LLM, SamplingParams

    if args.threads:
        torch.set_num_threads(args.threads)

    pages = args.num_prompts * ((PROMPT_LEN + args.output_len) // 16 + 2)
    llm = LLM(args.model, dtype=args.dtype, device=args.device, tensor_parallel_size=args.tp,
              num_pages=pages,
              max_num_seqs=args.num_prompts, max_num_batched_tokens=512,
              enable_prefix_caching=False)  # fmt: skip
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(10, 390, (PROMPT_LEN,), generator=gen).tolist()
               for _ in range(args.num_prompts)]  # fmt: skip
    params = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    llm.generate(prompts[:4], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    runner = llm.engine.model_runner
    steps = 0
    execute = runner.execute

    def counted(*a, **k):  # noqa: ANN002, ANN003, ANN202
        nonlocal steps
        steps += 1
        return execute(*a, **k)

    runner.execute = counted  # type: ignore[method-assign]
    group = runner.tp.group if runner.tp is not None else None
    if group is not None:
        group.collective_seconds = 0.0
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    token_ids = [o.outputs[0].token_ids for o in outputs]
    tokens = sum(len(ids) for ids in token_ids)
    collective = group.collective_seconds if group is not None else 0.0
    llm.close()
    return {"tok_s": tokens / elapsed, "steps": steps, "ms_per_step": 1e3 * elapsed / steps,
            "collective_ms_per_step": 1e3 * collective / steps,
            "threads": torch.get_num_threads(),
            "tokens_hash": hashlib.sha256(json.dumps(token_ids).encode()).hexdigest()[:16]}  # fmt: skip


def run_child(args: argparse.Namespace, model: Path, tp: int, threads: int) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "bench.engine.tp", "--child", "--tp", str(tp), "--threads", str(threads),
           "--model", str(model),
           "--dtype", args.dtype, "--device", args.device, "--num-prompts", str(args.num_prompts),
           "--output-len", str(args.output_len)]  # fmt: skip
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def table(runs: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> str:
    lines = [f"CPU: {cpu_model()}, {len(os.sched_getaffinity(0))} cores; {args.device}; "
             f"{args.dtype}; {args.num_prompts} prompts x {args.output_len} tokens; medians of "
             f"{args.repeats}", "",
             "| TP | output tok/s | ms/step | collective ms/step | share of step | threads/rank |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    tok_s = {}
    for label, results in runs.items():
        med = {k: statistics.median(r[k] for r in results) for k in results[0]
               if k != "tokens_hash"}  # fmt: skip
        tok_s[label] = med["tok_s"]
        share = med["collective_ms_per_step"] / med["ms_per_step"]
        lines.append(f"| {label} | {med['tok_s']:.1f} | {med['ms_per_step']:.2f} | "
                     f"{med['collective_ms_per_step']:.2f} | {share:.0%} | {med['threads']:.0f} |")  # fmt: skip
    (tp1, _, _), (tp1_one, _, _), (tp2, _, _) = CONFIGS
    if tp1_one not in runs:  # on a GPU
        tp1_one = tp1

    def same(*labels: str) -> str:
        hashes = {r["tokens_hash"] for label in labels for r in runs[label]}
        return "identical" if len(hashes) == 1 else "not identical"

    lines += ["", f"TP=2 / TP=1: {tok_s[tp2] / tok_s[tp1]:.2f}x (vs TP=1 on one thread: "
              f"{tok_s[tp2] / tok_s[tp1_one]:.2f}x). Greedy tokens: TP=1 runs {same(tp1, tp1_one)}; "
              f"TP=2 vs TP=1 {same(tp1, tp2)}"]  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (NCCL, 2 GPUs)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tp", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--model", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    if args.quick:
        args.num_prompts, args.output_len, args.repeats = 8, 16, 1
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "llama"
        write_model(model)
        # CPU threads per rank matter on the CPU only.
        configs = [c for c in CONFIGS if args.device == "cpu" or not c[2]]
        runs: dict[str, list[dict[str, Any]]] = {label: [] for label, _, _ in configs}
        for _ in range(args.repeats):
            for label, tp, threads in configs:
                runs[label].append(run_child(args, model, tp, threads))
    print(json.dumps({"runs": runs}))
    print(table(runs, args))


if __name__ == "__main__":
    main()
