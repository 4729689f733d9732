"""A real `python -m pagedserve serve` process on a free loopback port, shared by the session."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

API_KEY = "test-key"
LOAD_TIMEOUT_S = 600.0
BODY_LIMIT = 1024 * 1024


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


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp_dir = tmp_path_factory.mktemp("server")
    flags = ["--api-key", API_KEY, "--max-model-len", "1024", "--num-pages", "512",
             "--max-num-seqs", "64", "--max-body-bytes", str(BODY_LIMIT)]  # fmt: skip
    srv = start_server(tmp_dir, *flags)
    yield srv
    code = stop_server(srv)
    assert code == 0, srv.log()
