"""Images over HTTP on llama.cpp's two files: `pagedserve serve LM.gguf --mmproj MMPROJ.gguf`
against `llama-server -m LM.gguf --mmproj MMPROJ.gguf`, one server at a time, 2 threads each,
8 slots (bench/engine/vision.py runs it after its offline figures; see its docstring).

A call is c chat completions sent at once, each with one new random 224 x 224 PNG as a data URL
and a short question, max_tokens 1, greedy: from the first byte sent to the last answer, PNG
decoding, preprocessing, the tower and the prefill included.
"""

from __future__ import annotations

import base64
import io
import itertools
import statistics
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from PIL import Image

from bench.common.server import API_KEY, free_port, start_server, stop_server

QUESTION = "What is in the picture?"
SLOTS = 8
CONTEXT = 512  # tokens per slot: 64 image tokens and the question with room to spare
_SEEDS = itertools.count(1000)


def _data_url() -> str:
    rng = np.random.default_rng(next(_SEEDS))
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (224, 224, 3), dtype=np.uint8)).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _body(model: str) -> dict[str, Any]:
    content = [{"type": "image_url", "image_url": {"url": _data_url()}},
               {"type": "text", "text": QUESTION}]  # fmt: skip
    return {"model": model, "messages": [{"role": "user", "content": content}],
            "max_tokens": 1, "temperature": 0}  # fmt: skip


def _call(base_url: str, model: str, c: int) -> tuple[float, list[int]]:
    """c requests at once: seconds until the last answer, each one's prompt tokens."""
    bodies = [_body(model) for _ in range(c)]
    headers = {"Authorization": f"Bearer {API_KEY}"}

    def one(body: dict[str, Any]) -> int:
        answer = httpx.post(f"{base_url}/v1/chat/completions", json=body, headers=headers,
                            timeout=600)  # fmt: skip
        answer.raise_for_status()
        return int(answer.json()["usage"]["prompt_tokens"])

    with ThreadPoolExecutor(c) as pool:
        start = time.perf_counter()
        tokens = list(pool.map(one, bodies))
        return time.perf_counter() - start, tokens


def _measure(name: str, base_url: str, model: str, repeats: int) -> dict[int, float]:
    medians = {}
    for c in (1, SLOTS):
        _call(base_url, model, c)  # warm-up
        runs = [_call(base_url, model, c) for _ in range(repeats)]
        medians[c] = statistics.median(seconds for seconds, _ in runs)
        tokens = sorted({t for _, counted in runs for t in counted})
        print(f"  {name} c={c}: calls {[round(s * 1000) for s, _ in runs]} ms, "
              f"prompt tokens {tokens}", flush=True)  # fmt: skip
    return medians


def _llama_server(binary: Path, pair: tuple[Path, Path], tmp: Path) -> tuple[Any, str]:
    port = free_port()
    cmd = [str(binary), "-m", str(pair[0]), "--mmproj", str(pair[1]), "--host", "127.0.0.1",
           "--port", str(port), "-np", str(SLOTS), "-c", str(SLOTS * CONTEXT), "-t", "2",
           "-tb", "2", "--cache-ram", "0", "--no-webui", "--api-key", API_KEY]  # fmt: skip
    log = (tmp / "llama-server.log").open("wb")
    process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    base_url = f"http://127.0.0.1:{port}"
    for _ in range(240):
        if process.poll() is not None:
            raise RuntimeError(f"llama-server exited:\n{(tmp / 'llama-server.log').read_text()}")
        try:
            if httpx.get(base_url + "/health", timeout=2).status_code == 200:
                return process, base_url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    process.kill()
    raise RuntimeError("llama-server not ready after 120 s")


def serving(pair: tuple[Path, Path], binary: Path, tmp: Path, repeats: int) -> None:
    flags = [str(pair[0]), "--mmproj", str(pair[1]), "--api-key", API_KEY, "--dtype", "float32",
             "--num-pages", str(SLOTS * CONTEXT // 16), "--page-size", "16",
             "--max-model-len", str(CONTEXT), "--max-num-seqs", str(SLOTS)]  # fmt: skip
    print(f"over HTTP, same files, one server at a time: pagedserve {' '.join(flags[:3])} ...; "
          f"llama-server {binary} -np {SLOTS} -c {SLOTS * CONTEXT} -t 2 -tb 2")  # fmt: skip
    server = start_server(tmp, *flags)
    try:
        ours = _measure("pagedserve", server.base_url, server.model, repeats)
    finally:
        stop_server(server)
    process, base_url = _llama_server(binary, pair, tmp)
    try:
        theirs = _measure("llama-server", base_url, "model", repeats)
    finally:
        process.terminate()
        process.wait(60)
    print("| c | what | pagedserve serve --mmproj | llama-server --mmproj | ratio |")
    print("|---|---|---|---|---|")
    for c in (1, SLOTS):
        a, b = ours[c], theirs[c]
        what = "image to first token" if c == 1 else f"{c} images to first tokens"
        print(f"| {c} | {what} | {a * 1000:.0f} ms, {c / a:.2f} images/s | "
              f"{b * 1000:.0f} ms, {c / b:.2f} images/s | {b / a:.2f}x |")  # fmt: skip
