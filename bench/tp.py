"""Tensor parallelism on this machine's CPU: offline throughput at TP=1 vs TP=2, and the time
rank 0 spends in the step's collectives (issue 14).

    python bench/tp.py                 # bf16, 3 repeats (a few minutes here)
    python bench/tp.py --quick         # a smoke run

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
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # for tests.tiny_tokenizers
SHAPE = dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=16,
             num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=512,
             rms_norm_eps=1e-5)  # fmt: skip
PROMPT_LEN = 32


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def write_model(folder: Path) -> None:
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from tests.tiny_tokenizers import write_tiny_bpe

    write_tiny_bpe(folder)
    vocab = len(AutoTokenizer.from_pretrained(folder))
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=vocab, **SHAPE)).to(torch.bfloat16)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02)
    model.save_pretrained(folder)


def child(args: argparse.Namespace) -> dict[str, float]:
    """One engine at args.tp: warm up, then one timed offline run."""
    from pagedserve import LLM, SamplingParams

    pages = args.num_prompts * ((PROMPT_LEN + args.output_len) // 16 + 2)
    llm = LLM(args.model, dtype=args.dtype, tensor_parallel_size=args.tp, num_pages=pages,
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
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    collective = group.collective_seconds if group is not None else 0.0
    llm.close()
    return {"tok_s": tokens / elapsed, "steps": steps, "ms_per_step": 1e3 * elapsed / steps,
            "collective_ms_per_step": 1e3 * collective / steps,
            "threads": torch.get_num_threads()}  # fmt: skip


def run_child(args: argparse.Namespace, model: Path, tp: int) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--child", "--tp", str(tp), "--model", str(model),
           "--dtype", args.dtype, "--num-prompts", str(args.num_prompts),
           "--output-len", str(args.output_len)]  # fmt: skip
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT).stdout
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


def table(runs: dict[int, list[dict[str, float]]], args: argparse.Namespace) -> str:
    lines = [f"CPU: {cpu_model()}, {len(os.sched_getaffinity(0))} cores; {args.dtype}; "
             f"{args.num_prompts} prompts x {args.output_len} tokens; medians of {args.repeats}",
             "", "| TP | output tok/s | ms/step | collective ms/step | share of step | threads/rank |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for tp, results in runs.items():
        med = {k: statistics.median(r[k] for r in results) for k in results[0]}
        share = med["collective_ms_per_step"] / med["ms_per_step"]
        lines.append(f"| {tp} | {med['tok_s']:.1f} | {med['ms_per_step']:.2f} | "
                     f"{med['collective_ms_per_step']:.2f} | {share:.0%} | {med['threads']:.0f} |")  # fmt: skip
    ratio = statistics.median(r["tok_s"] for r in runs[2]) / statistics.median(
        r["tok_s"] for r in runs[1]
    )
    lines += ["", f"TP=2 / TP=1 throughput: {ratio:.2f}x"]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tp", type=int, default=1, help=argparse.SUPPRESS)
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
        runs: dict[int, list[dict[str, float]]] = {1: [], 2: []}
        for _ in range(args.repeats):
            for tp in runs:
                runs[tp].append(run_child(args, model, tp))
    print(json.dumps({"runs": runs}))
    print(table(runs, args))


if __name__ == "__main__":
    main()
