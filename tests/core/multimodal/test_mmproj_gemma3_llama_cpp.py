"""llama.cpp itself on a tiny random Gemma 3, where bench/serving/build_llama_cpp.sh has unpacked
its sources (and built llama-server) into bench/.work/: its converter (convert_hf_to_gguf.py,
and with --mmproj) writes, in f32 and f16, the bytes bench/common/tiny_mmproj.py writes
(test_mmproj_gemma3.py's fixture), and we read its files into transformers' greedy tokens;
`llama-server --mmproj` on the same files counts the same prompt tokens for one and two images
and gives the same greedy tokens up to a near-tie. Slow: `pytest -m slow
tests/core/multimodal/test_mmproj_gemma3_llama_cpp.py`."""

from __future__ import annotations

import base64
import io
import os
import subprocess
from pathlib import Path

import httpx
import pytest

from bench.common.server import free_port
from bench.common.tiny_gemma3_vl import IMAGE_SIZE
from bench.common.tiny_vlm import random_image
from pagedserve.core.engine.llm import LLM
from pagedserve.core.multimodal.gemma3 import BOI
from pagedserve.core.sampling_params import SamplingParams
from tests.core.multimodal.test_mmproj_gemma3 import (
    IMAGES,
    QUESTION,
    _llm,
    _messages,
    f16_rounded,
    files,  # noqa: F401 (fixtures)
    greedy,
    hf_greedy,
    prompt,
    written,  # noqa: F401
)
from tests.core.multimodal.test_mmproj_llama_cpp import (
    CONVERTERS,
    NEAR_TIE,
    WORK,
    _convert,
    _same_file,
    _wait,
)

# The native build, or the portable AVX2 one (LLAMA_CPP_NATIVE=OFF).
SERVERS = [WORK / f"llama.cpp-build{s}" / "bin" / "llama-server" for s in ("", "-avx2")]
LLAMA_SERVER = next((p for p in SERVERS if p.is_file()), None)
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not CONVERTERS,
        reason="llama.cpp's converter is not unpacked: run bench/serving/build_llama_cpp.sh",
    ),
]
# Images of the tower's size: llama.cpp pads another size into the square where transformers
# (and we) stretch it.
SQUARE = [random_image(IMAGE_SIZE, IMAGE_SIZE, 2), random_image(IMAGE_SIZE, IMAGE_SIZE, 4)]


@pytest.fixture(scope="module")
def converted(written, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:  # noqa: F811
    root = tmp_path_factory.mktemp("converted-gemma3")
    out = {}
    for qtype in ("F32", "F16"):
        pair = root / f"lm-{qtype}.gguf", root / f"mmproj-{qtype}.gguf"
        _convert(written[0], pair[0], qtype)
        _convert(written[0], pair[1], qtype, "--mmproj")
        out[qtype] = pair
    return out


def test_the_converter_writes_our_fixtures_bytes(converted, files) -> None:  # noqa: F811
    for qtype, pair in converted.items():
        for theirs, ours in zip(pair, files[qtype], strict=True):
            _same_file(theirs, ours)


def test_its_files_give_transformers_greedy_tokens(written, converted) -> None:  # noqa: F811
    folder, hf_model = written
    oracles = {"F32": hf_model, "F16": f16_rounded(hf_model)}
    for qtype, (lm, mmproj) in converted.items():
        llm = _llm(lm, mmproj)
        for num_images in (1, 2):
            ids, mm = prompt(llm, IMAGES[:num_images])
            _, want = hf_greedy(oracles[qtype], folder, IMAGES[:num_images])
            assert greedy(llm, ids, mm) == want, (qtype, num_images)


@pytest.mark.skipif(LLAMA_SERVER is None, reason="llama-server is not built in bench/.work")
def test_llama_server_agrees_on_the_same_files(converted, tmp_path: Path) -> None:
    assert LLAMA_SERVER is not None
    lm, mmproj = converted["F32"]
    llm = _llm(lm, mmproj)
    port = free_port()
    env = {**os.environ, "LLAMA_MEDIA_MARKER": "<__media__>"}  # else a random one
    cmd = [str(LLAMA_SERVER), "-m", str(lm), "--mmproj", str(mmproj), "--port", str(port),
           "-np", "1", "-c", "1024", "-t", "2", "--no-warmup"]  # fmt: skip
    with (tmp_path / "llama-server.log").open("wb") as log:
        server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        base_url = f"http://127.0.0.1:{port}"
        _wait(server, base_url, tmp_path / "llama-server.log")
        for num_images in (1, 2):
            _agree(llm, base_url, num_images)
    finally:
        server.terminate()
        server.wait(30)


def _agree(llm: LLM, base_url: str, num_images: int) -> None:
    """Our template's text with each <start_of_image> as transformers' processor surrounds it
    (blank lines) around llama.cpp's media marker (mtmd writes <start_of_image> and
    <end_of_image> around the image itself), the PNGs as multimodal_data."""
    images = SQUARE[:num_images]
    ids, mm = prompt(llm, images)
    params = SamplingParams(temperature=0, max_tokens=8, logprobs=3)
    request_id = f"llama-server-gemma3-{num_images}"
    llm.engine.add_request(request_id, ids, params, multimodal=mm)
    [out] = llm._run([request_id], False)
    template = llm.engine.chat_template
    assert template is not None
    text = template.render(_messages(images, QUESTION), add_generation_prompt=True)
    marked = text.replace(BOI, "\n\n<__media__>\n\n")
    pngs = []
    for image in images:
        buf = io.BytesIO()
        image.save(buf, "PNG")
        pngs.append(base64.b64encode(buf.getvalue()).decode())
    body = {"prompt": {"prompt_string": marked, "multimodal_data": pngs}, "n_predict": 8,
            "temperature": 0, "n_probs": 3, "return_tokens": True, "cache_prompt": False}  # fmt: skip
    theirs = httpx.post(base_url + "/completion", json=body, timeout=120).json()
    assert theirs["tokens_evaluated"] == len(ids), theirs  # the same image tokens
    steps = zip(out.outputs[0].logprobs or [], theirs["tokens"], strict=True)
    for i, (ours, token) in enumerate(steps):
        if token != ours.token_id:
            assert ours.top[0][1] - ours.top[1][1] < NEAR_TIE, (i, ours.top, token)
            return
