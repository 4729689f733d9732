"""Loading a model on demand (issue 39's figure): `pagedserve serve --models-dir` over the default
model, the first request's latency (the load, then the answer) next to the same request once the
model is loaded, and the process's RSS loaded and after `--idle-unload` freed the model.

    python -m bench.serving.model_load [--repeats 3] [--max-tokens 16]

Each repeat: wait until the model is unloaded (idle), time a cold request, then `--warm` warm
requests; medians over the repeats. The CPU model and the load average are printed: a figure is
compared only within one run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import psutil
from openai import OpenAI

from bench.common.server import API_KEY, start_server, stop_server
from pagedserve.core.models.resolve import resolve_model
from pagedserve.core.ops.cpu_features import cpu_model

IDLE_UNLOAD_S = 2.0
ASK = [{"role": "user", "content": "What is the capital of France?"}]


def _status(base_url: str, name: str) -> str:
    models = httpx.get(base_url + "/health", timeout=10).json()["models"]
    return str(models[name])


def _request(client: OpenAI, max_tokens: int) -> float:
    start = time.perf_counter()
    client.chat.completions.create(model="smol", messages=ASK, max_tokens=max_tokens,  # type: ignore[arg-type]
                                   temperature=0)  # fmt: skip
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warm", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=16)
    args = parser.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        models = Path(tmp) / "models"
        models.mkdir()
        (models / "smol.gguf").symlink_to(resolve_model("").path)
        flags = ["--models-dir", str(models), "--idle-unload", str(IDLE_UNLOAD_S),
                 "--api-key", API_KEY]  # fmt: skip
        server = start_server(Path(tmp), *flags)
        try:
            client = OpenAI(base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0)
            process = psutil.Process(server.process.pid)
            cold, warm, loaded_rss, unloaded_rss = [], [], [], []
            for _ in range(args.repeats):
                while _status(server.base_url, "smol") != "unloaded":
                    time.sleep(0.1)
                time.sleep(0.5)  # the engine's shutdown, after the status changed
                unloaded_rss.append(process.memory_info().rss)
                cold.append(_request(client, args.max_tokens))
                warm.append(statistics.median(_request(client, args.max_tokens)
                                              for _ in range(args.warm)))  # fmt: skip
                loaded_rss.append(process.memory_info().rss)
        finally:
            stop_server(server)
    mib = 1 << 20
    print(f"CPU: {cpu_model()}; load average before {load_before}, after {os.getloadavg()}; "
          f"SmolLM2-135M-Instruct Q4_1, chat, {args.max_tokens} tokens greedy, {args.repeats} "
          "repeats")  # fmt: skip
    print(f"first request (load + answer): median {statistics.median(cold):.2f} s "
          f"({', '.join(f'{c:.2f}' for c in cold)})")  # fmt: skip
    print(f"loaded (median of {args.warm} each): median {statistics.median(warm):.3f} s "
          f"({', '.join(f'{w:.3f}' for w in warm)})")  # fmt: skip
    print(f"RSS loaded {statistics.median(loaded_rss) / mib:.0f} MiB, after idle unload "
          f"{statistics.median(unloaded_rss[1:] or unloaded_rss) / mib:.0f} MiB "
          f"(before the first load {unloaded_rss[0] / mib:.0f} MiB)")  # fmt: skip


if __name__ == "__main__":
    main()
