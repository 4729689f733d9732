"""Load generator for any OpenAI-compatible server on this machine (issue 5).

    python -m bench.serving.serving --base-url http://127.0.0.1:8000/v1 --concurrency 8 \
        --num-requests 32 --prompt-tokens 128 --output-tokens 128 --server-kind pagedserve
    python -m bench.serving.serving --request-rate 4 --max-seconds 60 --prompts-jsonl prompts.jsonl

Every request streams. Prints ONE JSON object: requests completed/failed, time to first token
(TTFT), inter-token latency (ITL: the gaps between streamed chunks, as vLLM's benchmark counts
them), time per output token (TPOT: (e2e - TTFT) / (output tokens - 1)), end-to-end latency,
each as p50/p90/p99 in seconds; output tokens/s and requests/s over the measured window; the
real prompt lengths from `usage.prompt_tokens`; and the server's peak RSS when --pid is given.

Synthetic prompts are shuffled words from a fixed list, a different order per request (so no
two requests share a prefix, unless --shared-prefix), sized by asking the server itself:
calibration requests (max_tokens=1, a separate seed so they never warm the measured prompts'
prefix cache) read `usage.prompt_tokens` and scale the word count.
Output length is fixed where the server can be told (`--server-kind pagedserve`: ignore_eos +
min_tokens; `llamacpp`: ignore_eos + n_predict); otherwise max_tokens, counted from `usage`.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import itertools
import json
import random
import socket
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson

WORDS = (
    "apple river stone music garden window paper silver market winter candle forest harbor "
    "village morning yellow engine letter bridge simple orange travel little number country "
    "animal summer people answer button castle dinner family flower guitar island kitchen "
    "ladder mirror needle pocket rabbit shadow ticket valley wonder basket coffee doctor "
    "finger hammer jacket lemon marble napkin pencil rocket saddle tunnel velvet wagon "
    "blanket cabin desert feather glass honey insect jungle kettle lantern meadow orchard "
    "planet quiet ribbon school tiger umbrella violin whistle cotton dragon engineer "
    "festival harvest lesson mountain notebook ocean pepper question season thunder"
).split()
CALIBRATION_SEED = 1_000_003  # far from the measured seeds 0..num_requests


@dataclass(frozen=True)
class Options:
    base_url: str
    model: str
    api_key: str
    server_kind: str
    endpoint: str
    concurrency: int
    request_rate: float
    num_requests: int
    max_seconds: float
    prompt_tokens: int
    output_tokens: int
    prompts_jsonl: str
    dump_prompts: str
    shared_prefix: bool
    pid: int
    seed: int
    temperature: float
    timeout: float


@dataclass
class Record:
    """One request's timings (seconds since it was sent) and counts."""

    ok: bool = False
    error: str = ""
    ttft: float = 0.0
    e2e: float = 0.0
    chunk_times: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    output_tokens: int = 0


def check_loopback(base_url: str) -> None:
    """This tool loads a server hard: it only ever aims at this machine."""
    host = urlsplit(base_url).hostname or ""
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except socket.gaierror as exc:
        raise ValueError(f"--base-url: cannot resolve host {host!r}") from exc
    if not addresses or not all(ipaddress.ip_address(a).is_loopback for a in addresses):
        raise ValueError(f"--base-url: {host!r} is not a loopback address; refusing")


def synthetic_prompt(num_words: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(num_words))


def request_body(opts: Options, prompt: str, max_tokens: int, stream: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"model": opts.model, "max_tokens": max_tokens, "stream": stream,
                            "temperature": opts.temperature}  # fmt: skip
    if opts.endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if stream:
        body["stream_options"] = {"include_usage": True}
    if opts.server_kind == "pagedserve":
        body.update(ignore_eos=True, min_tokens=max_tokens)
    elif opts.server_kind == "llamacpp":
        body.update(ignore_eos=True, n_predict=max_tokens)
    return body


def endpoint_url(opts: Options) -> str:
    path = "/chat/completions" if opts.endpoint == "chat" else "/completions"
    return opts.base_url.rstrip("/") + path


async def count_prompt_tokens(client: aiohttp.ClientSession, opts: Options, prompt: str) -> int:
    body = request_body(opts, prompt, 1, stream=False)
    async with client.post(endpoint_url(opts), data=orjson.dumps(body)) as response:
        response.raise_for_status()
        return int(orjson.loads(await response.read())["usage"]["prompt_tokens"])


async def calibrate(client: aiohttp.ClientSession, opts: Options) -> int:
    """Words per prompt so that usage.prompt_tokens lands on --prompt-tokens (template and
    special tokens included: the count is what the server reports). Tokens grow linearly in
    words (slope: tokens per word, intercept: template overhead): fit two points, then nudge."""
    target = opts.prompt_tokens

    async def tokens(words: int) -> int:
        return await count_prompt_tokens(client, opts, synthetic_prompt(words, CALIBRATION_SEED))

    high, low = max(2, target), max(1, target // 2)
    got_high, got_low = await tokens(high), await tokens(low)
    slope = max(0.1, (got_high - got_low) / (high - low))
    words = max(1, round(high + (target - got_high) / slope))
    for _ in range(2):
        got = await tokens(words)
        if got == target:
            break
        words = max(1, words + round((target - got) / slope))
    return words


def load_jsonl(path: str) -> list[str]:
    """Each line: {"prompt": "..."} (or a bare JSON string)."""
    prompts = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if line.strip():
            item = json.loads(line)
            prompt = item if isinstance(item, str) else item.get("prompt")
            if not isinstance(prompt, str):
                raise ValueError(f"--prompts-jsonl: line {number} has no string 'prompt'")
            prompts.append(prompt)
    if not prompts:
        raise ValueError(f"--prompts-jsonl: {path} has no prompts")
    return prompts


async def make_prompts(client: aiohttp.ClientSession, opts: Options) -> list[str]:
    if opts.prompts_jsonl:
        pool = load_jsonl(opts.prompts_jsonl)
        return [pool[i % len(pool)] for i in range(opts.num_requests)]
    words = await calibrate(client, opts)
    if opts.shared_prefix:
        return [synthetic_prompt(words, opts.seed)] * opts.num_requests
    return [synthetic_prompt(words, opts.seed + i) for i in range(opts.num_requests)]


def parse_frame(line: bytes | str) -> dict[str, Any] | None:
    """The JSON of one SSE `data:` line; None for comments, blank lines and [DONE]."""
    raw = line.encode() if isinstance(line, str) else line
    if not raw.startswith(b"data:"):
        return None
    data = raw[5:].strip()
    return None if data in (b"", b"[DONE]") else orjson.loads(data)


def frame_text(frame: dict[str, Any]) -> str:
    choices = frame.get("choices") or []
    if not choices:
        return ""
    choice = choices[0]
    delta = choice.get("delta")
    return (delta.get("content") or "") if delta is not None else (choice.get("text") or "")


async def one_request(client: aiohttp.ClientSession, opts: Options, prompt: str) -> Record:
    record = Record()
    body = orjson.dumps(request_body(opts, prompt, opts.output_tokens, stream=True))
    start = time.perf_counter()
    try:
        async with client.post(endpoint_url(opts), data=body) as response:
            if response.status != 200:
                text = (await response.read()).decode(errors="replace")
                record.error = f"HTTP {response.status}: {text[:200]}"
                return record
            num_chunks = await read_stream(response.content, record, start)
    except (aiohttp.ClientError, asyncio.TimeoutError, KeyError, ValueError) as exc:
        record.error = f"{type(exc).__name__}: {exc}"
        return record
    record.e2e = time.perf_counter() - start
    if not record.error:
        record.output_tokens = record.output_tokens or num_chunks
        record.ok = record.output_tokens > 0 and bool(record.chunk_times)
        record.error = "" if record.ok else "no output tokens streamed"
    return record


async def read_stream(body: aiohttp.StreamReader, record: Record, start: float) -> int:
    """Fills the record from the SSE frames; returns the number of chunks that carried text.
    Reads whatever arrived at once and splits it into lines here: one Python iteration per
    network read, not per line (this process shares the CPU with the server it measures)."""
    num_chunks, rest = 0, b""
    async for data in body.iter_any():
        *lines, rest = (rest + data).split(b"\n")
        for line in lines:
            frame = parse_frame(line)
            if frame is None:
                continue
            if "error" in frame:
                record.error = f"stream error: {str(frame['error'])[:200]}"
                return num_chunks
            if frame_text(frame):
                now = time.perf_counter() - start
                if not record.chunk_times:
                    record.ttft = now
                record.chunk_times.append(now)
                num_chunks += 1
            usage = frame.get("usage")
            if usage:
                record.prompt_tokens = int(usage.get("prompt_tokens") or 0)
                record.output_tokens = int(usage.get("completion_tokens") or 0)
    return num_chunks


async def run_fixed(opts: Options, send: Callable[[int], Any], deadline: float) -> None:
    """--concurrency workers, each sending the next request as soon as its last one ends."""
    next_index = iter(range(opts.num_requests))

    async def worker() -> None:
        for i in next_index:
            if time.perf_counter() >= deadline:
                return
            await send(i)

    await asyncio.gather(*(worker() for _ in range(min(opts.concurrency, opts.num_requests))))


async def run_poisson(opts: Options, send: Callable[[int], Any], deadline: float) -> None:
    """Arrivals at --request-rate per second (exponential gaps); --concurrency caps in flight."""
    rng = random.Random(opts.seed)
    limit = asyncio.Semaphore(opts.concurrency if opts.concurrency > 0 else 1 << 30)

    async def limited(i: int) -> None:
        async with limit:
            await send(i)

    tasks = []
    for i in range(opts.num_requests):
        if time.perf_counter() >= deadline:
            break
        tasks.append(asyncio.create_task(limited(i)))
        await asyncio.sleep(rng.expovariate(opts.request_rate))
    await asyncio.gather(*tasks)


class RssSampler:
    """Peak resident memory of a process: the max VmRSS seen while the load runs, and the
    kernel's own high-water mark VmHWM (which also covers model loading)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak_rss_kb = 0
        self.status = Path(f"/proc/{pid}/status")

    def sample(self) -> dict[str, int]:
        fields = {}
        for line in self.status.read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(value.split()[0])
        self.peak_rss_kb = max(self.peak_rss_kb, fields.get("VmRSS", 0))
        return fields

    async def run(self, period: float = 0.1) -> None:
        while True:
            self.sample()
            await asyncio.sleep(period)

    def report(self) -> dict[str, Any]:
        hwm = self.sample().get("VmHWM", 0)
        return {"pid": self.pid, "peak_rss_mib": round(self.peak_rss_kb / 1024, 1),
                "vm_hwm_mib": round(hwm / 1024, 1)}  # fmt: skip


def percentiles(values: list[float]) -> dict[str, float] | None:
    """p50/p90/p99 interpolated linearly between ranks (numpy's default), and the mean."""
    if not values:
        return None
    ordered = sorted(values)

    def at(q: float) -> float:
        rank = q * (len(ordered) - 1)
        low = int(rank)
        high = min(low + 1, len(ordered) - 1)
        return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)

    return {
        "p50": round(at(0.5), 4),
        "p90": round(at(0.9), 4),
        "p99": round(at(0.99), 4),
        "mean": round(statistics.fmean(ordered), 4),
    }


def summarize(opts: Options, records: list[Record], seconds: float) -> dict[str, Any]:
    done = [r for r in records if r.ok]
    itl = [b - a for r in done for a, b in itertools.pairwise(r.chunk_times)]
    tpot = [(r.e2e - r.ttft) / (r.output_tokens - 1) for r in done if r.output_tokens > 1]
    output = sum(r.output_tokens for r in done)
    prompt_lens = [r.prompt_tokens for r in done if r.prompt_tokens]
    errors = sorted({r.error for r in records if not r.ok})
    return {
        "base_url": opts.base_url, "model": opts.model, "server_kind": opts.server_kind,
        "endpoint": opts.endpoint, "concurrency": opts.concurrency,
        "request_rate": opts.request_rate or None, "shared_prefix": opts.shared_prefix,
        "requested_prompt_tokens": None if opts.prompts_jsonl else opts.prompt_tokens,
        "requested_output_tokens": opts.output_tokens,
        "completed": len(done), "failed": len(records) - len(done),
        "not_finished": opts.num_requests - len(records), "errors": errors[:5],
        "duration_s": round(seconds, 3),
        "prompt_tokens": percentiles([float(n) for n in prompt_lens]),
        "output_tokens_total": output,
        "output_tokens_per_request": percentiles([float(r.output_tokens) for r in done]),
        "output_tok_per_s": round(output / seconds, 2) if seconds > 0 else 0.0,
        "requests_per_s": round(len(done) / seconds, 3) if seconds > 0 else 0.0,
        "chunks_per_token": round(sum(len(r.chunk_times) for r in done) / max(1, output), 3),
        "ttft_s": percentiles([r.ttft for r in done]), "itl_s": percentiles(itl),
        "tpot_s": percentiles(tpot), "e2e_s": percentiles([r.e2e for r in done]),
    }  # fmt: skip


async def served_model(client: aiohttp.ClientSession, base_url: str) -> str:
    async with client.get(base_url.rstrip("/") + "/models") as response:
        response.raise_for_status()
        return str(orjson.loads(await response.read())["data"][0]["id"])


async def run(opts: Options) -> dict[str, Any]:
    headers = {"Content-Type": "application/json"}
    if opts.api_key:
        headers["Authorization"] = f"Bearer {opts.api_key}"
    # No cap (--concurrency is the cap), and a fresh connection per request: llama-server closes
    # a connection after a streamed response, and aiohttp may send the next request into it
    # before it sees the close ("Can not write request body", "Server disconnected"): every
    # other request on uvloop, a few per grid on asyncio's loop (earlier compare.sh runs).
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    timeout = aiohttp.ClientTimeout(total=opts.timeout, connect=30.0)
    session = aiohttp.ClientSession(headers=headers, connector=connector, timeout=timeout)
    async with session as client:
        if not opts.model:
            opts = Options(**{**opts.__dict__, "model": await served_model(client, opts.base_url)})
        prompts = await make_prompts(client, opts)
        if opts.dump_prompts:
            lines = (json.dumps({"prompt": prompt}) + "\n" for prompt in prompts)
            Path(opts.dump_prompts).write_text("".join(lines))
        records: list[Record] = []

        async def send(i: int) -> None:
            records.append(await one_request(client, opts, prompts[i]))

        sampler = RssSampler(opts.pid) if opts.pid else None
        sampling = asyncio.create_task(sampler.run()) if sampler else None
        start = time.perf_counter()
        drive = run_poisson if opts.request_rate > 0 else run_fixed
        try:
            await asyncio.wait_for(drive(opts, send, start + opts.max_seconds),
                                   timeout=opts.max_seconds + opts.timeout)  # fmt: skip
        except asyncio.TimeoutError:
            pass  # requests still in flight are neither completed nor failed: "not_finished"
        seconds = time.perf_counter() - start
        if sampling:
            sampling.cancel()
        report = summarize(opts, records, seconds)
        if sampler:
            report["server_memory"] = sampler.report()
        return report


# flag -> (type, default, help); the Options field is the flag's name with "_" for "-".
FLAGS: dict[str, tuple[type, Any, str]] = {
    "--base-url": (str, "http://127.0.0.1:8000/v1", "the server's /v1 (loopback only)"),
    "--model": (str, "", "default: the first of GET /v1/models"),
    "--api-key": (str, "", "sent as Authorization: Bearer KEY"),
    "--concurrency": (int, 1, "requests in flight (with --request-rate: a cap, 0 = none)"),
    "--request-rate": (float, 0.0, "Poisson arrivals per second (0: fixed --concurrency)"),
    "--num-requests": (int, 16, "requests to send"),
    "--max-seconds": (float, 600.0, "no request starts after this; in-flight ones get "
                      "--timeout more"),
    "--prompt-tokens": (int, 128, "synthetic prompt length, as the server counts it"),
    "--output-tokens": (int, 128, "output tokens per request"),
    "--prompts-jsonl": (str, "", 'lines of {"prompt": "..."} instead of synthetic prompts'),
    "--dump-prompts": (str, "", "write the prompts sent as JSONL (for an offline replay)"),
    "--pid": (int, 0, "the server's PID, for its peak RSS"),
    "--seed": (int, 0, "first synthetic prompt's seed (request i uses seed + i)"),
    "--temperature": (float, 0.0, "sampling temperature"),
    "--timeout": (float, 600.0, "seconds per request"),
}  # fmt: skip


def parse_args(argv: list[str] | None = None) -> Options:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for flag, (kind, default, help_text) in FLAGS.items():
        p.add_argument(flag, type=kind, default=default, help=help_text)
    p.add_argument(
        "--server-kind",
        choices=["pagedserve", "llamacpp", "openai"],
        default="openai",
        help="which extension fields fix the output length",
    )
    p.add_argument("--endpoint", choices=["chat", "completions"], default="completions")
    p.add_argument("--shared-prefix", action="store_true",
                   help="every request sends the same synthetic prompt")  # fmt: skip
    opts = Options(**vars(p.parse_args(argv)))
    validate(opts)
    return opts


def validate(opts: Options) -> None:
    positive = {"num_requests": opts.num_requests, "prompt_tokens": opts.prompt_tokens,
                "output_tokens": opts.output_tokens, "max_seconds": opts.max_seconds,
                "timeout": opts.timeout}  # fmt: skip
    for name, value in positive.items():
        if value <= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be > 0, got {value}")
    if opts.request_rate < 0 or (opts.request_rate == 0 and opts.concurrency < 1):
        raise ValueError("--concurrency must be >= 1 (or give --request-rate > 0)")
    if opts.pid and not Path(f"/proc/{opts.pid}/status").exists():
        raise ValueError(f"--pid: no process {opts.pid}")
    check_loopback(opts.base_url)


def run_loop(coro: Any) -> Any:
    """On uvloop where installed (a dependency of pagedserve except on Windows): this process
    shares the CPU with the server it measures, and on uvloop it spends ~25% less CPU per
    streamed chunk (bench/RESULTS.md, issue 15)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def main(argv: list[str] | None = None) -> int:
    try:
        opts = parse_args(argv)
    except ValueError as exc:
        print(f"serving.py: {exc}", file=sys.stderr)
        return 2
    report = run_loop(run(opts))
    print(json.dumps(report))
    return 0 if report["failed"] == 0 and report["completed"] > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
