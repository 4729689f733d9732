"""Soak: hold a steady load on a pagedserve server for a given time; report errors and memory.

`--concurrency` clients each loop over streaming completions (`--max-tokens`, ignore_eos). Every
`--interval` seconds one JSON line reports requests done, errors (non-200, malformed streams,
error frames, transport errors), the server's RSS and KV pages in use; a last line sums up,
including RSS growth from the first sample to the last and whether every page came back.

    python -m bench.serving.soak --duration 600                      # starts its own server
    python -m bench.serving.soak --url http://127.0.0.1:8000 --pid 1234 --duration 3600
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx
import psutil

from bench.common.server import (
    Server,
    check_completion_stream,
    parse_sse,
    start_server,
    stop_server,
)


async def _client_loop(
    client: httpx.AsyncClient, worker: int, max_tokens: int, stop_at: float, counts: Counter
) -> None:
    i = 0
    while time.monotonic() < stop_at:
        i += 1
        body = {"prompt": f"Soak {worker}-{i}:", "max_tokens": max_tokens, "ignore_eos": True,
                "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
        try:
            async with client.stream("POST", "/v1/completions", json=body) as response:
                raw = await response.aread()
            if response.status_code != 200:
                counts[f"status_{response.status_code}"] += 1
                continue
            check_completion_stream(parse_sse(raw), max_tokens)
            counts["ok"] += 1
        except AssertionError:
            counts["malformed_stream"] += 1
        except httpx.HTTPError as exc:
            counts[type(exc).__name__] += 1


def _sample(base_url: str, process: psutil.Process | None, t0: float, counts: Counter) -> dict:
    pages = None
    try:
        text = httpx.get(base_url + "/metrics", timeout=10).text
        pages = sum(float(line.rpartition(" ")[2]) for line in text.splitlines()
                    if line.startswith("pagedserve:kv_pages_used"))  # fmt: skip
    except httpx.HTTPError:
        counts["metrics_unreachable"] += 1
    rss = process.memory_info().rss / 2**20 if process is not None else None
    return {"t_s": round(time.monotonic() - t0, 1), "requests": dict(counts),
            "rss_mib": rss and round(rss, 1), "kv_pages_used": pages}  # fmt: skip


async def soak(base_url: str, pid: int | None, args: argparse.Namespace) -> dict:
    process = psutil.Process(pid) if pid else None
    counts: Counter = Counter()
    t0 = time.monotonic()
    limits = httpx.Limits(max_connections=args.concurrency)
    async with httpx.AsyncClient(base_url=base_url, timeout=600, limits=limits) as client:
        jobs = [asyncio.create_task(_client_loop(client, w, args.max_tokens,
                                                 t0 + args.duration, counts))
                for w in range(args.concurrency)]  # fmt: skip
        samples = []
        while not all(job.done() for job in jobs):
            await asyncio.sleep(args.interval)
            samples.append(await asyncio.to_thread(_sample, base_url, process, t0, counts))
            print(json.dumps(samples[-1]), flush=True)
        await asyncio.gather(*jobs)
    await asyncio.sleep(2)  # the last aborts/finishes reach the engine
    final = _sample(base_url, process, t0, counts)
    errors = sum(v for k, v in counts.items() if k != "ok")
    rss = [s["rss_mib"] for s in samples + [final] if s["rss_mib"]]
    growth = round(rss[-1] / rss[0] - 1, 4) if len(rss) > 1 else None
    return {"summary": True, "ok": counts["ok"], "errors": errors, "rss_mib_first": rss and rss[0],
            "rss_mib_last": rss and rss[-1], "rss_growth": growth,
            "kv_pages_used_after": final["kv_pages_used"], **final}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a running server (default: start one)")
    parser.add_argument("--pid", type=int, help="the running server's pid, for its RSS")
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of load")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--interval", type=float, default=30.0, help="seconds between reports")
    args = parser.parse_args()
    server: Server | None = None
    if args.url is None:
        flags = ["--max-model-len", "1024", "--num-pages", "512"]
        server = start_server(Path(tempfile.mkdtemp(prefix="soak-")), *flags)
    base_url = args.url or server.base_url  # type: ignore[union-attr]
    pid = args.pid or (server.process.pid if server else None)
    try:
        summary = asyncio.run(soak(base_url, pid, args))
    finally:
        if server is not None:
            stop_server(server)
    print(json.dumps(summary))
    return 0 if summary["errors"] == 0 and summary["kv_pages_used_after"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
