"""The chart's rendered container, run for real: `python -m pagedserve` with the exact args and
API-key Secret of the CPU value set (only --host/--port moved to a free loopback port, and a
small KV cache), then probed the way the kubelet, Prometheus and the endpoint picker would."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.common.server import LOAD_TIMEOUT_S, free_port
from tests.deploy.chart import (
    find,
    parse_server,
    render_set,
    scraped_metric_names,
    server_container,
)

VALUE_SET = "cpu+inference-extension"
SMALL_CACHE = ["--num-pages", "256", "--max-model-len", "1024"]


class Pod:
    """The server process plus what the chart said about it."""

    def __init__(self, tmp: Path) -> None:
        self.objects = render_set(VALUE_SET)
        self.container = server_container(self.objects)
        args = list(self.container["args"])
        self.port = free_port()
        args[args.index("--host") + 1] = "127.0.0.1"
        args[args.index("--port") + 1] = str(self.port)
        secret = find(self.objects, "Secret")
        (key_env,) = [e for e in self.container["env"] if "valueFrom" in e]
        ref = key_env["valueFrom"]["secretKeyRef"]
        self.api_key = base64.b64decode(secret["data"][ref["key"]]).decode()
        env = {**os.environ, "PYTHONUNBUFFERED": "1", key_env["name"]: self.api_key}
        self.config = parse_server(args, env)
        self.log_path = tmp / "server.log"
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "pagedserve", *args, *SMALL_CACHE],
                cwd=tmp, stdout=log, stderr=subprocess.STDOUT, env=env,
            )  # fmt: skip
        self.url = f"http://127.0.0.1:{self.port}"

    def probe_path(self) -> str:
        path: str = self.container["startupProbe"]["httpGet"]["path"]
        return path

    def wait_started(self) -> None:
        """What the startupProbe does: poll until 200."""
        deadline = time.monotonic() + LOAD_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log_path.read_text()
            try:
                if httpx.get(self.url + self.probe_path(), timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        raise TimeoutError(self.log_path.read_text())

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pod]:
    pod = Pod(tmp_path_factory.mktemp("pod"))
    try:
        pod.wait_started()
        yield pod
    finally:
        if pod.process.poll() is None:
            pod.process.kill()
            pod.process.wait()


def test_probes_and_scrapes_need_no_key_the_api_does(pod: Pod) -> None:
    assert httpx.get(pod.url + pod.probe_path()).status_code == 200
    assert httpx.get(pod.url + "/metrics").status_code == 200
    assert httpx.get(pod.url + "/v1/models").status_code == 401
    models = httpx.get(pod.url + "/v1/models", headers=pod.headers()).json()
    names = ["smollm2", "SmolLM2-135M-Instruct"]  # cpu-values.yaml's list, the first reported
    assert [m["id"] for m in models["data"]] == list(pod.config.served_model_name) == names


def _samples(text: str) -> dict[str, str]:
    """`name{labels}` -> value for every sample line."""
    return dict(line.rsplit(" ", 1) for line in text.splitlines() if line and line[0] != "#")


def test_the_metrics_the_cluster_reads_are_exported(pod: Pod) -> None:
    samples = _samples(httpx.get(pod.url + "/metrics").text)
    exported = {key.split("{", 1)[0] for key in samples}
    wanted = scraped_metric_names(pod.objects)
    assert wanted <= exported, wanted - exported
    # The prefix-cache scorer reads the page size and the page count from these labels.
    (info,) = [key for key in samples if key.startswith("vllm:cache_config_info{")]
    assert 'num_gpu_blocks="256"' in info and 'block_size="16"' in info


def _stream(pod: Pod, first_chunk: threading.Event, out: dict[str, Any]) -> None:
    body = {"model": pod.config.served_model_name[-1], "prompt": "Once upon a time",
            "max_tokens": 8, "ignore_eos": True, "stream": True, "temperature": 0,
            "stream_options": {"include_usage": True}}  # fmt: skip
    lines = []
    with httpx.stream("POST", pod.url + "/v1/completions", json=body, headers=pod.headers(),
                      timeout=120) as response:  # fmt: skip
        out["status"] = response.status_code
        for line in response.iter_lines():
            if line:
                lines.append(line)
                first_chunk.set()
    out["lines"] = lines


def test_sigterm_drains_the_request_in_flight_then_exits(pod: Pod) -> None:
    """The kubelet's SIGTERM (after preStop): the stream in flight completes, then the process
    exits 0 within --graceful-timeout, inside terminationGracePeriodSeconds."""
    first_chunk, out = threading.Event(), {}
    client = threading.Thread(target=_stream, args=(pod, first_chunk, out))
    client.start()
    assert first_chunk.wait(60), pod.log_path.read_text()
    sent = time.monotonic()
    pod.process.send_signal(signal.SIGTERM)
    code = pod.process.wait(pod.config.graceful_timeout + 10)
    took = time.monotonic() - sent
    client.join(10)
    assert code == 0, pod.log_path.read_text()
    assert out["status"] == 200 and out["lines"][-1] == "data: [DONE]"
    usage = json.loads(out["lines"][-2].removeprefix("data: "))["usage"]
    # Asked by its last name, answered under the first (vLLM's --served-model-name).
    first = json.loads(out["lines"][0].removeprefix("data: "))
    assert first["model"] == pod.config.served_model_name[0] == "smollm2"
    assert usage["completion_tokens"] == 8  # the whole request, not cut by the shutdown
    grace = find(pod.objects, "Deployment", "model-server")["spec"]["template"]["spec"][
        "terminationGracePeriodSeconds"
    ]
    assert took < pod.config.graceful_timeout < grace
    print(f"SIGTERM to exit: {took:.2f} s (graceful timeout {pod.config.graceful_timeout} s)")
