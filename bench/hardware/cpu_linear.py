"""--cpu-linear native vs torch vs auto (and amx), side by side, through LLM.generate (issue 12).

    python -m bench.hardware.cpu_linear --repeats 3 [--threads 2]

Each measurement is a fresh process on the default model with --quantization none (bf16 dense
linears: the dispatch applies) and --no-deterministic (torch's matmul is not batch-invariant, so
all three modes run without it, and auto may take torch): 64 prompts of 32 tokens x 128 output
tokens (offline tok/s), the prefill of one 1,000-token prompt (tok/s, one output token, median
of 3) and one request decoding 64 tokens alone (tok/s). The modes alternate in a rotating order,
repeat by repeat, so machine noise falls on all; medians are reported, every run in a comment.
Where the CPU has AMX-BF16 tiles two more modes run: amx (the native kernel on tiles at every
row count) and auto-det (auto with --deterministic: tiles at every row count or none, unless
they round as AVX512-BF16 does). Prints the CPU model and features, and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

MODES = ("native", "torch", "auto")
AMX_MODES = ("amx", "auto-det")
FIGURES = ("offline_64x128_tok_s", "prefill_1k_tok_s", "decode_c1_tok_s")


def worker(mode: str, threads: int) -> dict:
    import torch

    from pagedserve import LLM, SamplingParams

    torch.set_num_threads(threads)
    start = time.perf_counter()
    deterministic, cpu_linear = mode == "auto-det", mode.removesuffix("-det")
    llm = LLM(quantization="none", dtype="bfloat16", deterministic=deterministic,
              cpu_linear=cpu_linear, max_num_seqs=64, max_model_len=2048,
              enable_prefix_caching=False)  # fmt: skip
    load_s = time.perf_counter() - start
    text = llm.tokenizer.encode("The engine batched every request it could and paged it. " * 150)
    greedy = SamplingParams(temperature=0, max_tokens=128, ignore_eos=True)
    llm.generate([text[:32]], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    start = time.perf_counter()
    outs = llm.generate([text[i : i + 32] for i in range(64)], greedy)
    offline = sum(len(o.outputs[0].token_ids) for o in outs) / (time.perf_counter() - start)
    one = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    prefill = []
    for shift in range(3):
        start = time.perf_counter()
        llm.generate([text[shift : shift + 1000]], one)
        prefill.append(1000 / (time.perf_counter() - start))
    start = time.perf_counter()
    llm.generate([text[100:132]], SamplingParams(temperature=0, max_tokens=64, ignore_eos=True))
    decode = 64 / (time.perf_counter() - start)
    model = llm.engine.model_runner.model
    return {
        "offline_64x128_tok_s": offline,
        "prefill_1k_tok_s": statistics.median(prefill),
        "decode_c1_tok_s": decode,
        "start_s": load_s,
        "torch_from": model.torch_from,
        "amx_from": model.amx_from,
        "steps": dict(model.linear_steps),
    }


def run(mode: str, threads: int) -> dict:
    cmd = [sys.executable, __file__, "--worker", mode, "--threads", str(threads)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--worker", choices=MODES + AMX_MODES, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(a.worker, a.threads)))
        return 0
    from pagedserve.core.ops.cpu_features import cpu_features, cpu_model
    from pagedserve.core.ops.linear import amx_available

    print(f"CPU: {cpu_model() or 'unknown'} ({cpu_features().describe()}); threads "
          f"{a.threads}; load average at start {os.getloadavg()}")  # fmt: skip
    modes = MODES + (AMX_MODES if amx_available() else ())
    runs: dict[str, list[dict]] = {mode: [] for mode in modes}
    for i in range(a.repeats):
        for j in range(len(modes)):
            mode = modes[(i + j) % len(modes)]
            runs[mode].append(run(mode, a.threads))
    others = [m for m in modes if m != "native"]
    print("| figure | " + " | ".join(modes) + " | "
          + " | ".join(f"{m} vs native" for m in others) + " |")  # fmt: skip
    print("|---|" + "---:|" * (len(modes) + len(others)))
    for key in FIGURES:
        med = {mode: statistics.median(r[key] for r in runs[mode]) for mode in modes}
        print(f"| {key} | " + " | ".join(f"{med[m]:.1f}" for m in modes) + " | "
              + " | ".join(f"{med[m] / med['native']:.2f}x" for m in others) + " |")  # fmt: skip
        each = {mode: [round(r[key], 1) for r in rs] for mode, rs in runs.items()}
        print(f"<!-- {key} runs: {each} -->")
    chose = {m: [(r["torch_from"], r["amx_from"]) for r in runs[m]] for m in modes if "auto" in m}
    print(f"<!-- auto chose (torch_from, amx_from) {chose}; start-up s "
          f"{ {m: [round(r['start_s'], 1) for r in rs] for m, rs in runs.items()} }; "
          f"steps {[r['steps'] for r in runs['auto']]} -->")  # fmt: skip
    print(f"load average at end {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
