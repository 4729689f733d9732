"""llama.cpp itself on a tiny random Qwen2.5-VL, where bench/serving/build_llama_cpp.sh has
unpacked its sources (and built llama-server) into bench/.work/: its converter
(convert_hf_to_gguf.py, and with --mmproj) writes, in f32 and f16, the bytes
bench/common/tiny_mmproj.py writes (test_mmproj_gguf.py's fixture), and we read its files into
transformers' greedy tokens; `llama-server --mmproj` on the same files counts the same prompt
tokens for one and two images and gives the same greedy tokens up to a near-tie (our top two
logprobs within 0.05). Slow (the converter imports transformers per file): `pytest -m slow
tests/core/multimodal/test_mmproj_llama_cpp.py`."""

from __future__ import annotations

import base64
import io
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import gguf
import httpx
import numpy as np
import pytest

from bench.common.server import free_port
from pagedserve.core.engine.llm import LLM
from pagedserve.core.multimodal.inputs import MultiModalInputs
from tests.core.multimodal.test_mmproj_gguf import (
    IMAGES,
    NUM_TOKENS,
    QUESTION,
    files,  # noqa: F401 (fixtures)
    oracle,
    written,  # noqa: F401
)
from tests.core.multimodal.vlm_driver import assert_pairs_give, chat_prompt, load, messages, run

WORK = Path(__file__).resolve().parents[3] / "bench" / ".work"
CONVERTERS = sorted(WORK.glob("llama_cpp_python-*/vendor/llama.cpp/convert_hf_to_gguf.py"))
# The native build, else the portable AVX2 one (LLAMA_CPP_NATIVE=OFF).
_SERVERS = [WORK / f"llama.cpp-build{s}" / "bin" / "llama-server" for s in ("", "-avx2")]
LLAMA_SERVER = next((p for p in _SERVERS if p.is_file()), _SERVERS[0])
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not CONVERTERS,
        reason="llama.cpp's converter is not unpacked: run bench/serving/build_llama_cpp.sh",
    ),
]
# The converter names a BPE vocabulary's split by hashing how real models' tokenizers encode a
# test string; the tiny one was trained on GPT-2's split, which llama.cpp calls "gpt-2".
_RUN_CONVERTER = """
import runpy, sys
from pathlib import Path
script = Path(sys.argv[1]); sys.argv = sys.argv[1:]
sys.path[:0] = [str(script.parent), str(script.parent / "gguf-py")]
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
runpy.run_path(str(script), run_name="__main__")
"""
# From the folder's name, and the key count that counts them.
# A tiny random model's next-token distribution is nearly flat (top logprobs near -4.7 over
# 400 tokens): its top two often lie within a few hundredths.
NEAR_TIE = 0.05
_SKIPPED_KEYS = ("general.name", "general.size_label", "GGUF.kv_count")


def _convert(folder: Path, out: Path, qtype: str, *extra: str) -> None:
    cmd = [sys.executable, "-c", _RUN_CONVERTER, str(CONVERTERS[-1]), str(folder),
           "--outfile", str(out), "--outtype", qtype.lower(), *extra]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]


def _same_file(theirs: Path, ours: Path) -> None:
    a, b = gguf.GGUFReader(theirs), gguf.GGUFReader(ours)
    keys = [{k: f.contents() for k, f in r.fields.items() if not k.startswith(_SKIPPED_KEYS)}
            for r in (a, b)]  # fmt: skip
    assert keys[0] == keys[1]
    tensors = [{t.name: (t.tensor_type, np.asarray(t.data).tobytes()) for t in r.tensors}
               for r in (a, b)]  # fmt: skip
    assert tensors[0] == tensors[1]


def convert_pairs(folder: Path, root: Path) -> dict[str, tuple[Path, Path]]:
    """llama.cpp's converter's (language model, projector) of the folder, per type."""
    out = {}
    for qtype in ("F32", "F16"):
        pair = root / f"lm-{qtype}.gguf", root / f"mmproj-{qtype}.gguf"
        _convert(folder, pair[0], qtype)
        _convert(folder, pair[1], qtype, "--mmproj")
        out[qtype] = pair
    return out


@contextmanager
def llama_server(lm: Path, mmproj: Path, log_dir: Path) -> Iterator[str]:
    """`llama-server -m LM --mmproj MMPROJ` on a free port, one slot; yields its base URL."""
    port = free_port()
    env = {**os.environ, "LLAMA_MEDIA_MARKER": "<__media__>"}  # else a random one
    cmd = [str(LLAMA_SERVER), "-m", str(lm), "--mmproj", str(mmproj), "--port", str(port),
           "-np", "1", "-c", "1024", "-t", "2", "--no-warmup"]  # fmt: skip
    log_path = log_dir / "llama-server.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        base_url = f"http://127.0.0.1:{port}"
        _wait(process, base_url, log_path)
        yield base_url
    finally:
        process.terminate()
        process.wait(30)


def agree(
    llm: LLM, base_url: str, prompt: tuple[list[int], MultiModalInputs], marked: str, images
) -> None:
    """llama-server on `marked` (the prompt's text with llama.cpp's media marker where each
    image goes) and the images as PNGs counts our prompt's tokens and gives our greedy tokens
    up to a near-tie of ours. (Its n_probs lists are not used: with an image in the prompt,
    this build's start a step or two late and come short.)"""
    ids, mm = prompt
    out = run(llm, ids, mm, NUM_TOKENS, ignore_eos=False, logprobs=3)
    pngs = []
    for image in images:
        buf = io.BytesIO()
        image.save(buf, "PNG")
        pngs.append(base64.b64encode(buf.getvalue()).decode())
    body = {"prompt": {"prompt_string": marked, "multimodal_data": pngs}, "n_predict": NUM_TOKENS,
            "temperature": 0, "n_probs": 3, "return_tokens": True, "cache_prompt": False}  # fmt: skip
    theirs = httpx.post(base_url + "/completion", json=body, timeout=120).json()
    assert theirs["tokens_evaluated"] == len(ids), theirs  # the same image tokens
    steps = zip(out.outputs[0].logprobs or [], theirs["tokens"], strict=True)
    for i, (ours, token) in enumerate(steps):
        if token != ours.token_id:
            assert ours.top[0][1] - ours.top[1][1] < NEAR_TIE, (i, ours.top, token)
            return


@pytest.fixture(scope="module")
def converted(written, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:  # noqa: F811
    return convert_pairs(written[0], tmp_path_factory.mktemp("converted"))


def test_the_converter_writes_our_fixtures_bytes(converted, files) -> None:  # noqa: F811
    assert_same_files(converted, files)


def assert_same_files(
    converted: dict[str, tuple[Path, Path]], ours: dict[str, tuple[Path, Path]]
) -> None:
    """The converter's pairs hold our writer's keys and tensors, type by type."""
    for qtype, pair in converted.items():
        for theirs, mine in zip(pair, ours[qtype], strict=True):
            _same_file(theirs, mine)


def test_its_files_give_transformers_greedy_tokens(written, converted) -> None:  # noqa: F811
    assert_pairs_give(converted, oracle(written[1]), IMAGES, QUESTION, NUM_TOKENS)


@pytest.mark.skipif(not LLAMA_SERVER.is_file(), reason="llama-server is not built in bench/.work")
def test_llama_server_agrees_on_the_same_files(converted, tmp_path: Path) -> None:
    """Our template's text with each image as llama.cpp's media marker (mtmd wraps the image
    in <|vision_start|> / <|vision_end|> itself); the images are multiples of 28 pixels, so
    neither side resizes them."""
    lm, mmproj = converted["F32"]
    llm = load(lm, mmproj)
    template = llm.engine.chat_template
    assert template is not None
    with llama_server(lm, mmproj, tmp_path) as base_url:
        for num_images in (1, 2):
            images = IMAGES[:num_images]
            text = template.render(messages(images, QUESTION), add_generation_prompt=True)
            marked = text.replace("<|vision_start|><|image_pad|><|vision_end|>", "<__media__>")
            agree(llm, base_url, chat_prompt(llm, images, QUESTION), marked, images)


def _wait(server: subprocess.Popen[bytes], base_url: str, log: Path) -> None:
    for _ in range(240):
        assert server.poll() is None, log.read_text()
        try:
            if httpx.get(base_url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise AssertionError("llama-server not ready: " + log.read_text())
