"""A real `python -m pagedserve serve` process on a free loopback port, and the SSE checks the
tests and the bench scripts share (moved here from tests/: bench never imports a test module)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson

API_KEY = "test-key"
LOAD_TIMEOUT_S = 600.0


@dataclass
class Server:
    base_url: str
    """http://127.0.0.1:PORT (add /v1 for the OpenAI SDK)."""
    process: subprocess.Popen[bytes]
    log_path: Path
    model: str

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metrics(self) -> dict[str, float]:
        """Unlabelled-by-value samples: `name{labels}` -> value."""
        text = httpx.get(self.base_url + "/metrics", timeout=10).text
        samples = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                samples[name] = float(value)
        return samples

    def metric(self, name: str, samples: dict[str, float] | None = None) -> float:
        """Sum of a metric's samples over its labels, from `samples` (one metrics() scrape,
        for gauges that must be read at one moment) or a new scrape."""
        samples = self.metrics() if samples is None else samples
        return sum(v for k, v in samples.items() if k == name or k.startswith(name + "{"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(tmp_dir: Path, *flags: str) -> Server:
    """Spawn the CLI from `tmp_dir` (never the repo root, so the installed package is imported)
    and wait for /health; the model is the bundled default."""
    port = free_port()
    log_path = tmp_dir / f"server-{port}.log"
    cmd = [sys.executable, "-m", "pagedserve", "serve", "--port", str(port), *flags]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("PAGEDSERVE_API_KEY", None)
    with log_path.open("wb") as log:
        process = subprocess.Popen(cmd, cwd=tmp_dir, stdout=log, stderr=subprocess.STDOUT, env=env)
    base_url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + LOAD_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}:\n{log_path.read_text()}")
        try:
            if httpx.get(base_url + "/health", timeout=2).status_code == 200:
                headers = {"Authorization": f"Bearer {API_KEY}"}
                models = httpx.get(base_url + "/v1/models", headers=headers, timeout=5).json()
                return Server(base_url, process, log_path, models["data"][0]["id"])
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    stop_server(Server(base_url, process, log_path, ""))
    raise RuntimeError(f"server not ready after {LOAD_TIMEOUT_S}s:\n{log_path.read_text()}")


def stop_server(server: Server, timeout_s: float = 60.0) -> int:
    if server.process.poll() is None:
        server.process.send_signal(signal.SIGTERM)
        try:
            server.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait()
    return server.process.returncode


def parse_sse(raw: bytes) -> list[Any]:
    """SSE body -> payloads; "[DONE]" stays a string. Fails on any frame that is not
    `data: <json>` followed by a blank line."""
    text = raw.decode("utf-8")
    assert text.endswith("\n\n"), text[-200:]
    frames = text[:-2].split("\n\n")
    payloads: list[Any] = []
    for frame in frames:
        assert frame.startswith("data: ") and "\n" not in frame, frame[:200]
        data = frame.removeprefix("data: ")
        payloads.append(data if data == "[DONE]" else orjson.loads(data))
    return payloads


def check_completion_stream(payloads: list[Any], max_tokens: int) -> str:
    """A well-formed /v1/completions stream with usage: one id, text deltas, exactly one
    finish_reason on the last choice chunk, usage, then [DONE]. Returns the text."""
    assert payloads[-1] == "[DONE]", payloads[-3:]
    chunks, usage = payloads[:-2], payloads[-2]
    assert not any("error" in c for c in payloads[:-1]), payloads
    assert usage["choices"] == [] and 1 <= usage["usage"]["completion_tokens"] <= max_tokens
    assert chunks and len({c["id"] for c in payloads[:-1]}) == 1
    reasons = [c["choices"][0]["finish_reason"] for c in chunks]
    assert reasons[-1] in ("stop", "length") and not any(reasons[:-1]), reasons
    return "".join(c["choices"][0]["text"] for c in chunks)
