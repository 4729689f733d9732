"""The cost of batch invariance (issue 16), side by side: this checkout with --deterministic (the
default) vs --no-deterministic, or this checkout vs a baseline build.

    python -m bench.engine.determinism_cost --repeats 5          # the flag on vs off, same build

    git archive <baseline-rev> | tar -x -C /tmp/base
    cmake -S /tmp/base -B /tmp/base/build -DPAGEDSERVE_CUDA=OFF \
        -Dpybind11_DIR="$(python -m pybind11 --cmakedir)" && cmake --build /tmp/base/build -j2
    python -m bench.engine.determinism_cost --baseline /tmp/base --repeats 5 [--candidate /tmp/cand]

Each measurement is a fresh process on the default model (offline engine, greedy, ignore_eos):
c=32 output tokens/s (32 prompts of 100-400 tokens, --output-tokens each, 32 running at once)
and the prefill of one 1024-token prompt (tokens/s, one output token). The two builds
alternate, repeat by repeat, so machine noise falls on both; medians are reported. The baseline
(and a --candidate tree built the same way, else this checkout's install) is imported from its
source tree, with the `_core` module beside its sources or else the newest under its build/
(bench/common/in_tree.py: without this venv's editable-install finder, the import path as is).
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

from bench.common import ROOT, in_tree


def worker(dtype: str, output_tokens: int, deterministic: bool, quantization: str) -> dict:
    """One process's figures for the build it imported."""
    import torch

    import pagedserve
    from pagedserve import LLM, SamplingParams

    torch.set_num_threads(2)
    options: dict = {} if deterministic else {"deterministic": False}  # baselines lack the flag
    if quantization:
        options["quantization"] = quantization
    llm = LLM(dtype=dtype, max_num_seqs=32, max_model_len=2048, enable_prefix_caching=False,
              **options)  # fmt: skip
    text = llm.tokenizer.encode(
        "The engine batched every request it could and paged its cache. " * 120
    )
    prompts = [text[i : i + 100 + (97 * i) % 300] for i in range(32)]
    params = SamplingParams(temperature=0, max_tokens=output_tokens, ignore_eos=True)
    llm.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    decode_s = time.perf_counter() - start
    generated = sum(len(o.outputs[0].token_ids) for o in outs)
    one = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    prefill = []
    for shift in range(3):  # distinct prompts: no cache hits anyway (caching is off)
        start = time.perf_counter()
        llm.generate([text[shift : shift + 1024]], one)
        prefill.append(1024 / (time.perf_counter() - start))
    return {
        "build": str(Path(pagedserve.__file__).parent.parent),
        "batch_invariant": getattr(llm.engine, "batch_invariant", None),  # None: not reported
        "c32_tok_s": generated / decode_s,
        "prefill_1k_tok_s": statistics.median(prefill),
    }


def run(
    base: str, dtype: str, output_tokens: int, deterministic: bool = True, quantization: str = ""
) -> dict:
    cmd = in_tree(base, "-m", "bench.engine.determinism_cost", "--worker", "--dtype", dtype,
                  "--output-tokens", str(output_tokens))  # fmt: skip
    if not deterministic:
        cmd.append("--no-deterministic")
    if quantization:
        cmd += ["--quantization", quantization]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--baseline",
        help="source tree of a baseline build (see above); without it,"
        " this checkout's --no-deterministic is the baseline",
    )
    ap.add_argument("--candidate", default="", help="source tree to compare (default: this)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--dtype", default="bfloat16", help=argparse.SUPPRESS)
    ap.add_argument("--no-deterministic", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--quantization", default="",
                    help="this checkout's --quantization (none: dequantized bf16, as baselines"
                    " before quantized GGUF kernels ran)")  # fmt: skip
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(a.dtype, a.output_tokens, not a.no_deterministic, a.quantization)))
        return 0
    # (name, source tree, deterministic): a baseline build, or this one with the flag off.
    baseline = ("baseline", a.baseline, True) if a.baseline else ("baseline", a.candidate, False)
    from pagedserve.core.ops.cpu_features import cpu_model  # not in baselines' trees

    print(f"CPU: {cpu_model()}; load average at start {os.getloadavg()}")
    old_name = "baseline build" if a.baseline else "--no-deterministic"
    print(f"| dtype | figure | {old_name} | this checkout | ratio |\n|---|---|---:|---:|---:|")
    for dtype in a.dtypes.split(","):
        runs: dict[str, list[dict]] = {"baseline": [], "this": []}
        for i in range(a.repeats):
            order = [baseline, ("this", a.candidate, True)]
            for name, base, deterministic in order if i % 2 == 0 else order[::-1]:
                quant = a.quantization if name == "this" or not a.baseline else ""
                runs[name].append(run(base, dtype, a.output_tokens, deterministic, quant))
        for key in ("c32_tok_s", "prefill_1k_tok_s"):
            old = statistics.median(r[key] for r in runs["baseline"])
            new = statistics.median(r[key] for r in runs["this"])
            print(f"| {dtype} | {key} | {old:.1f} | {new:.1f} | {new / old:.3f} |")
            each = {name: [round(r[key], 1) for r in rs] for name, rs in runs.items()}
            print(f"<!-- {dtype} {key} runs: {each} -->")
        flags = {name: {r["batch_invariant"] for r in rs} for name, rs in runs.items()}
        print(f"<!-- {dtype}: builds {runs['baseline'][0]['build']} vs {runs['this'][0]['build']};"
              f" batch_invariant reported {flags} -->")  # fmt: skip
    print(f"load average at end {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
