"""GGUF weights kept quantized (--quantization auto) vs dequantized to bf16 (none), end to end.

    python -m bench.engine.quantized [--repeats 3] [--threads 2] [--llama-server PATH]

On the default model (SmolLM2-135M-Instruct Q4_1), offline through LLM.generate, engines
interleaved within each repeat (medians):
- decode: one request, 128 greedy tokens after a short prompt, tokens/s;
- offline: 64 prompts x 128 tokens (ignore_eos, greedy), output tokens/s;
- weights: bytes of the linear layers each engine reads per token.
Then greedy agreement: for each of PROMPTS, 64 greedy tokens of auto vs none and, with
--llama-server (bench/serving/build_llama_cpp.sh's binary), vs llama.cpp's /completion on the same file
(temperature 0, top_k 1), each pair's first position where the token ids differ. Prints the
CPU model and load average: the machine is shared, compare within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import torch

from pagedserve.core.engine.llm import LLM
from pagedserve.core.models.linear.dense import PackableLinear
from pagedserve.core.models.linear.quantized import QuantizedGateUpLinear, QuantizedLinear
from pagedserve.core.models.resolve import DEFAULT_CACHE_DIR, fetch_default_model
from pagedserve.core.ops.cpu_features import cpu_model
from pagedserve.core.sampling_params import SamplingParams

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Write a haiku about the sea.",
    "Explain what a hash table is in one paragraph.",
    "1, 2, 3, 4, 5,",
    "Once upon a time, in a small village,",
    "The three primary colors are",
    "Translate 'good morning' into Spanish:",
]
GREEDY_TOKENS = 64


def weight_bytes(llm: LLM) -> int:
    model = llm.engine.model_runner.model  # type: ignore[attr-defined]
    kinds = (PackableLinear, QuantizedLinear, QuantizedGateUpLinear)
    return sum(m.weight_bytes() for m in model.modules() if isinstance(m, kinds))


def tokens_per_s(llm: LLM, prompts: Sequence[list[int]], max_tokens: int) -> float:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    start = time.perf_counter()
    outs = llm.generate(list(prompts), params)
    elapsed = time.perf_counter() - start
    return sum(len(o.outputs[0].token_ids) for o in outs) / elapsed


def greedy(llm: LLM, prompt: str) -> tuple[list[int], list[int]]:
    ids = llm.tokenizer.encode(prompt)
    params = SamplingParams(temperature=0, max_tokens=GREEDY_TOKENS, ignore_eos=True)
    return ids, list(llm.generate([ids], params)[0].outputs[0].token_ids)


def first_divergence(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def llama_tokens(
    binary: Path, gguf: Path, prompts: list[list[int]], threads: int
) -> list[list[int]]:
    port = free_port()
    server = subprocess.Popen(
        [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
         "-t", str(threads), "-c", "2048", "-np", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                urllib.request.urlopen(url + "/health", timeout=1)
                break
            except OSError:
                time.sleep(0.2)
        result = []
        for ids in prompts:
            body = {"prompt": ids, "n_predict": GREEDY_TOKENS, "temperature": 0, "top_k": 1,
                    "ignore_eos": True, "return_tokens": True, "cache_prompt": False}  # fmt: skip
            request = urllib.request.Request(url + "/completion", json.dumps(body).encode(),
                                             {"Content-Type": "application/json"})  # fmt: skip
            with urllib.request.urlopen(request, timeout=120) as response:
                result.append(list(json.load(response)["tokens"]))
        return result
    finally:
        server.terminate()
        server.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llama-server", type=Path, default=None)
    ap.add_argument("--agreement-only", action="store_true", help="skip the speed figures")
    ap.add_argument("--per-layer", action="store_true",
                    help="also time auto with the decoder stack off (layers one by one)")  # fmt: skip
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"CPU: {cpu_model()}; threads {args.threads}; load average {os.getloadavg()}")
    common = {"enable_prefix_caching": False, "max_num_seqs": 64}
    llms = {q: LLM(quantization=q, **common) for q in ("auto", "none")}
    if args.per_layer:  # auto without the native decoder stack: the layers one by one
        llms["auto-per-layer"] = LLM(quantization="auto", **common)
        llms["auto-per-layer"].engine.model_runner.model.stack = None  # type: ignore[attr-defined]
    for q, llm in llms.items():
        print(f"{q}: linear weights {weight_bytes(llm) / 1e6:.1f} MB read per token")
    short = llms["none"].tokenizer.encode("Tell me a story about a robot.")
    batch = [llms["none"].tokenizer.encode(f"Story {i}: once upon a time") for i in range(64)]
    figures: dict[str, dict[str, list[float]]] = {q: {"decode": [], "offline": []} for q in llms}
    for _ in range(0 if args.agreement_only else args.repeats):
        for q, llm in llms.items():
            figures[q]["decode"].append(tokens_per_s(llm, [short], 128))
            figures[q]["offline"].append(tokens_per_s(llm, batch, 128))
    for name in ("decode", "offline") if not args.agreement_only else ():
        medians = {q: statistics.median(figures[q][name]) for q in llms}
        print(f"{name}: " + ", ".join(f"{q} {v:.1f} tok/s" for q, v in medians.items())
              + f"; auto/none {medians['auto'] / medians['none']:.2f}x")  # fmt: skip
    print(f"load average after timing {os.getloadavg()}")
    runs = {q: [greedy(llms[q], p) for p in PROMPTS] for q in ("auto", "none")}
    prompts = [ids for ids, _ in runs["auto"]]
    others = {"none": [t for _, t in runs["none"]]}
    if args.llama_server is not None:
        gguf = fetch_default_model(DEFAULT_CACHE_DIR.expanduser())
        others["llama.cpp"] = llama_tokens(args.llama_server, gguf, prompts, args.threads)
    for name, tokens in others.items():
        positions = [first_divergence(a, b) for (_, a), b in zip(runs["auto"], tokens, strict=True)]
        print(f"first divergence auto vs {name} over {GREEDY_TOKENS} tokens: {positions}")
    if "llama.cpp" in others:
        positions = [
            first_divergence(a, b) for a, b in zip(others["none"], others["llama.cpp"], strict=True)
        ]
        print(f"first divergence none vs llama.cpp: {positions}")


if __name__ == "__main__":
    main()
