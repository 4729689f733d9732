"""Gemma 3 with images through a real server (`pagedserve serve` on a tiny random Gemma 3, from
its HF folder and from llama.cpp's two files with --mmproj): the OpenAI SDK with a base64 data
URL gets transformers' fp32 greedy answer on the prompt its processor builds (chat template,
image sequence), counted in the same prompt tokens; with n = 2 each choice is the single
request's answer (greedy) or the single request's seeded seed + i (sampling); a bad image is a
400 naming the part."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import torch
from PIL import Image

from bench.common.server import API_KEY, Server, start_server, stop_server
from bench.common.tiny_gemma3_vl import write_tiny_gemma3_vl
from bench.common.tiny_mmproj import write_gguf_gemma3_vl
from bench.common.tiny_vlm import random_png

transformers = pytest.importorskip("transformers")

NUM_TOKENS = 8
QUESTION = "What is in the picture?"


PNG = random_png(7, (70, 40))
DATA_URL = "data:image/png;base64," + base64.b64encode(PNG).decode()


@pytest.fixture(scope="module", params=["hf", "gguf"])
def written(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, torch.nn.Module, list[str]]:
    """(folder, transformers model, the model's server arguments): the folder itself, or its
    language model GGUF and --mmproj projector (f32; the model shaped as llama.cpp says)."""
    root = tmp_path_factory.mktemp(f"gemma3-{request.param}")
    folder = root / "tiny-gemma3"
    model = write_tiny_gemma3_vl(folder, seed=5, llama_cpp=request.param == "gguf")
    if request.param == "hf":
        return folder, model, [str(folder)]
    lm, mmproj = root / "tiny-gemma3.gguf", root / "mmproj-tiny-gemma3.gguf"
    write_gguf_gemma3_vl(folder, lm, mmproj)
    return folder, model, [str(lm), "--mmproj", str(mmproj)]


@pytest.fixture(scope="module")
def server(written: tuple[Path, Any, list[str]],
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:  # fmt: skip
    flags = [*written[2], "--api-key", API_KEY, "--dtype", "float32", "--num-pages", "32",
             "--page-size", "16", "--max-model-len", "256"]  # fmt: skip
    srv = start_server(tmp_path_factory.mktemp("gemma3-server"), *flags)
    yield srv
    assert stop_server(srv) == 0, srv.log()


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0)


def _expected(written: tuple[Path, Any, list[str]]) -> tuple[int, str]:
    """transformers' prompt (its processor's chat template and image sequence) and fp32
    greedy answer: (prompt tokens, text)."""
    folder, model, _ = written
    processor = transformers.AutoProcessor.from_pretrained(folder)
    messages = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}
    ]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    inputs = processor(text=text, images=[Image.open(io.BytesIO(PNG))], return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=NUM_TOKENS, do_sample=False)
    num_prompt = inputs["input_ids"].shape[1]
    return num_prompt, processor.tokenizer.decode(out[0, num_prompt:], skip_special_tokens=True)


def _ask(client: openai.OpenAI, server: Server, url: str = DATA_URL, **params: Any) -> Any:
    return client.chat.completions.create(
        model=server.model,
        messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}},
            {"type": "text", "text": QUESTION}]}],
        max_tokens=NUM_TOKENS, **params,
    )  # fmt: skip


def test_a_data_url_answers_as_transformers(client, server, written) -> None:
    response = _ask(client, server, temperature=0)
    num_prompt, answer = _expected(written)
    assert response.usage is not None and response.usage.prompt_tokens == num_prompt
    assert response.choices[0].message.content == answer


def test_n_choices_are_each_the_single_requests(client, server) -> None:
    """n = 2 greedy: both choices are the single request's answer; seeded sampling: choice i
    is the single request seeded seed + i (as the engine seeds output i), and they differ."""
    [single] = _ask(client, server, temperature=0).choices
    both = _ask(client, server, temperature=0, n=2).choices
    assert [c.message.content for c in both] == [single.message.content] * 2
    sampled = _ask(client, server, temperature=1.0, seed=11, n=2).choices
    texts = [c.message.content for c in sorted(sampled, key=lambda c: c.index)]
    alone = [_ask(client, server, temperature=1.0, seed=11 + i).choices[0].message.content
             for i in range(2)]  # fmt: skip
    assert texts == alone and texts[0] != texts[1]


def test_a_truncated_image_is_a_400_naming_the_part(client, server) -> None:
    truncated = "data:image/png;base64," + base64.b64encode(PNG[: len(PNG) // 2]).decode()
    with pytest.raises(openai.BadRequestError) as info:
        _ask(client, server, truncated, temperature=0)
    error = info.value.body
    assert isinstance(error, dict) and error["param"] == "messages[0].content[0].image_url"
