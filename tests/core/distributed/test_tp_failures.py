"""The real server at --tensor-parallel-size 2 (a subprocess on a loopback port, gloo, float32):
streaming through the OpenAI SDK gives TP=1's text; a killed worker turns the engine dead
(/health 503, the request in flight gets an error, nothing hangs); SIGTERM, or the server's
own death, leaves no worker process behind. Plus two "nodes" on 127.0.0.1."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import psutil
import pytest

from bench.common.server import Server, free_port, start_server, stop_server
from pagedserve import LLM, SamplingParams
from pagedserve.core.lora_request import LoRARequest

PROMPT = "the quick brown fox"
PARAMS = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
FLAGS = ("--tensor-parallel-size", "2", "--dtype", "float32", "--num-pages", "64",
         "--distributed-timeout", "60")  # fmt: skip


def _workers(server: Server) -> list[psutil.Process]:
    """The server's spawned rank processes (children running multiprocessing's spawn main)."""
    children = psutil.Process(server.process.pid).children(recursive=True)
    return [c for c in children if "spawn_main" in " ".join(c.cmdline())]


def _gone(processes: list[psutil.Process], timeout: float = 15.0) -> bool:
    _, alive = psutil.wait_procs(processes, timeout=timeout)
    return not alive


def _client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0)


def _offline_text(model: Path, lora: LoRARequest | None = None) -> str:
    llm = LLM(str(model), dtype="float32", num_pages=64, enable_lora=lora is not None)
    return llm.generate([PROMPT], PARAMS, lora_request=lora)[0].outputs[0].text


def test_streaming_matches_tp1_and_sigterm_stops_the_workers(
    tp_model: Path, tmp_path: Path
) -> None:
    server = start_server(tmp_path, str(tp_model), *FLAGS)
    workers = _workers(server)
    assert len(workers) == 1
    try:
        stream = _client(server).completions.create(
            model=server.model, prompt=PROMPT, max_tokens=16, temperature=0, stream=True,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        text = "".join(chunk.choices[0].text for chunk in stream if chunk.choices)
        assert text == _offline_text(tp_model)
        assert "tensor_parallel_size 2" in server.log()
    finally:
        assert stop_server(server) == 0
    assert _gone(workers), "a worker outlived the server's SIGTERM"


def test_killed_worker_makes_the_engine_dead(tp_model: Path, tmp_path: Path) -> None:
    server = start_server(tmp_path, str(tp_model), *FLAGS)
    (worker,) = _workers(server)
    errors: list[BaseException] = []

    def request() -> None:
        try:
            stream = _client(server).completions.create(
                model=server.model, prompt=PROMPT, max_tokens=200, stream=True
            )
            for _ in stream:
                pass
        except BaseException as exc:
            errors.append(exc)

    try:
        worker.suspend()  # the request's step waits in a collective on the stopped worker
        thread = threading.Thread(target=request)
        thread.start()
        time.sleep(1.0)
        assert thread.is_alive()
        worker.kill()  # its sockets close: the step's collective fails at once
        thread.join(30)
        assert not thread.is_alive(), "the request in flight hung after its worker died"
        assert errors and isinstance(errors[0], openai.APIError), errors
        assert httpx.get(server.base_url + "/health", timeout=5).status_code == 503
        with pytest.raises(openai.APIStatusError) as refused:
            _client(server).completions.create(model=server.model, prompt=PROMPT, max_tokens=2)
        assert refused.value.status_code == 503
    finally:
        stop_server(server)
    assert _gone([worker])


def test_server_killed_takes_its_workers_along(tp_model: Path, tmp_path: Path) -> None:
    server = start_server(tmp_path, str(tp_model), *FLAGS)
    workers = _workers(server)
    server.process.send_signal(signal.SIGKILL)
    server.process.wait(10)
    assert _gone(workers), "a worker outlived its killed server"


def test_two_nodes_on_loopback(tp_model: Path, tmp_path: Path) -> None:
    """Node 1 (workers only, `pagedserve serve --node-rank 1`) meets node 0 (this process,
    rank 0, offline) at 127.0.0.1; the ranks give TP=1's tokens; node 0's close() ends node 1.
    Node 0 serves a LoRA adapter that node 1 was told nothing of (no --enable-lora): its rank
    makes its stacks as rank 0's at the first adapter, and the adapter's tokens are TP=1's."""
    pytest.importorskip("peft")
    from bench.common.tiny_lora import write_peft_adapter

    adapter = LoRARequest("attn", 0, str(write_peft_adapter(tp_model, tmp_path / "attn", r=4)))
    port = free_port()
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    node1 = subprocess.Popen(
        [sys.executable, "-m", "pagedserve", "serve", str(tp_model), "--dtype", "float32",
         "--tensor-parallel-size", "2", "--nnodes", "2", "--node-rank", "1"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        llm = LLM(str(tp_model), dtype="float32", num_pages=64, tensor_parallel_size=2,
                  nnodes=2, node_rank=0, master_port=port, enable_lora=True)  # fmt: skip
        outputs = llm.generate([PROMPT] * 2, PARAMS, lora_request=[None, adapter])
        llm.close()
        assert node1.wait(30) == 0, node1.stdout.read() if node1.stdout else ""
    finally:
        if node1.poll() is None:
            node1.kill()
    assert outputs[0].outputs[0].text != outputs[1].outputs[0].text  # the adapter tells
    assert [o.outputs[0].text for o in outputs] == [
        _offline_text(tp_model, lora) for lora in (None, adapter)
    ]
