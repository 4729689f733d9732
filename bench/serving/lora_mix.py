"""Multi-LoRA under load (issue 39's figure): the same c=32 streamed greedy chat requests on one
server (the default model, SmolLM2-135M's Q4_1 GGUF kept quantized), spread over 4 adapters and
the base model, then all on the base model, in alternating waves; output tokens per second of
each wave, medians, their ratio; and the time POST /v1/load_lora_adapter and
/v1/unload_lora_adapter take.

    python -m bench.serving.lora_mix [--waves 3] [--concurrency 32] [--max-tokens 64] [--rank 8]
        [--tensor-parallel-size 1]

The adapters are random rank-`rank` PEFT folders on every q/k/v/o/gate/up/down projection,
written here (their values do not change the cost). The CPU model and the load average are
printed: a figure is compared only within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import torch
from openai import AsyncOpenAI
from safetensors.torch import save_file

from bench.common.server import API_KEY, start_server, stop_server
from bench.serving.messages_overhead import chat_wave
from pagedserve.core.ops.cpu_features import cpu_model

ADAPTERS = ["a1", "a2", "a3", "a4"]
SHAPE = {"hidden": 576, "heads": 9, "kv_heads": 3, "head": 64, "width": 1536, "layers": 30}
"""SmolLM2-135M's projections."""


def write_adapter(folder: Path, rank: int, seed: int) -> Path:
    """A PEFT folder as PEFT writes it, on every projection of SmolLM2-135M."""
    s = SHAPE
    q, kv = s["heads"] * s["head"], s["kv_heads"] * s["head"]
    dims = {"self_attn.q_proj": (s["hidden"], q), "self_attn.k_proj": (s["hidden"], kv),
            "self_attn.v_proj": (s["hidden"], kv), "self_attn.o_proj": (q, s["hidden"]),
            "mlp.gate_proj": (s["hidden"], s["width"]), "mlp.up_proj": (s["hidden"], s["width"]),
            "mlp.down_proj": (s["width"], s["hidden"])}  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for i in range(s["layers"]):
        for name, (k, n) in dims.items():
            prefix = f"base_model.model.model.layers.{i}.{name}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, k, generator=gen) * 0.01
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(n, rank, generator=gen) * 0.01
    folder.mkdir(parents=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    targets = [name.split(".")[1] for name in dims]
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": targets,
              "bias": "none", "modules_to_save": None}  # fmt: skip
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return folder


async def run(base_url: str, model: str, args: argparse.Namespace) -> dict[str, list[float]]:
    client = AsyncOpenAI(base_url=base_url + "/v1", api_key=API_KEY, max_retries=0)
    mixes = {"4 adapters + base": [model, *ADAPTERS], "base only": [model]}
    rates: dict[str, list[float]] = {name: [] for name in mixes}
    await chat_wave(client, mixes["4 adapters + base"], args.concurrency, 8)  # warm-up
    for i in range(args.waves):
        for name in list(mixes)[:: 1 if i % 2 == 0 else -1]:
            start = time.perf_counter()
            tokens = await chat_wave(client, mixes[name], args.concurrency, args.max_tokens)
            rates[name].append(tokens / (time.perf_counter() - start))
    return rates


def load_unload(base_url: str, folder: Path, repeats: int = 5) -> tuple[list[float], list[float]]:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    loads: list[float] = []
    unloads: list[float] = []
    for _ in range(repeats):
        for path, times, body in (
            ("/v1/load_lora_adapter", loads, {"lora_name": "extra", "lora_path": str(folder)}),
            ("/v1/unload_lora_adapter", unloads, {"lora_name": "extra"}),
        ):
            start = time.perf_counter()
            response = httpx.post(base_url + path, json=body, headers=headers, timeout=120)
            times.append(time.perf_counter() - start)
            response.raise_for_status()
    return loads, unloads


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--waves", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--tensor-parallel-size", type=int, default=1,
                        help="the server's --tensor-parallel-size (ranks split the 2 threads)")  # fmt: skip
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        folders = [write_adapter(root / name, args.rank, i) for i, name in enumerate(ADAPTERS)]
        extra = write_adapter(root / "extra", args.rank, 99)
        modules = [f"{name}={folder}" for name, folder in zip(ADAPTERS, folders, strict=True)]
        server = start_server(root, "--api-key", API_KEY, "--lora-modules", *modules,
                              "--max-loras", "5", "--max-lora-rank", str(args.rank),
                              "--allow-runtime-lora-updating", "--tensor-parallel-size",
                              str(args.tensor_parallel_size))  # fmt: skip
        try:
            load = os.getloadavg()
            rates = asyncio.run(run(server.base_url, server.model, args))
            loads, unloads = load_unload(server.base_url, extra)
        finally:
            stop_server(server)
    mixed, base = (statistics.median(v) for v in rates.values())
    print(f"CPU: {cpu_model()}; c={args.concurrency}, {args.max_tokens} tokens out, rank "
          f"{args.rank} on all 7 projections, {args.waves} waves each, tensor parallel "
          f"{args.tensor_parallel_size}; load average before "
          f"{load[0]:.2f}, after {os.getloadavg()[0]:.2f}")  # fmt: skip
    print("| requests | output tok/s per wave | median |\n|---|---|---:|")
    for name, values in rates.items():
        print(f"| {name} | {', '.join(f'{v:.1f}' for v in values)} | "
              f"{statistics.median(values):.1f} |")  # fmt: skip
    print(f"mixed / base only: {mixed / base:.3f}x")
    print(f"load_lora_adapter: median {statistics.median(loads) * 1e3:.0f} ms "
          f"({', '.join(f'{t * 1e3:.0f}' for t in loads)}); unload_lora_adapter: median "
          f"{statistics.median(unloads) * 1e3:.0f} ms")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
