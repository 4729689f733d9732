"""Gemma 3 with images through a real server (`pagedserve serve` on a tiny random Gemma 3):
the OpenAI SDK with a base64 data URL gets transformers' fp32 greedy answer on the prompt its
processor builds (chat template, image sequence), counted in the same prompt tokens."""

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
from bench.common.tiny_vlm import random_png

transformers = pytest.importorskip("transformers")

NUM_TOKENS = 8
QUESTION = "What is in the picture?"


PNG = random_png(7, (70, 40))
DATA_URL = "data:image/png;base64," + base64.b64encode(PNG).decode()


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    folder = tmp_path_factory.mktemp("gemma3") / "tiny-gemma3"
    return folder, write_tiny_gemma3_vl(folder, seed=5)


@pytest.fixture(scope="module")
def server(written: tuple[Path, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    flags = [str(written[0]), "--api-key", API_KEY, "--dtype", "float32", "--num-pages", "32",
             "--page-size", "16", "--max-model-len", "256"]  # fmt: skip
    srv = start_server(tmp_path_factory.mktemp("gemma3-server"), *flags)
    yield srv
    assert stop_server(srv) == 0, srv.log()


def _expected(written: tuple[Path, Any]) -> tuple[int, str]:
    """transformers' prompt (its processor's chat template and image sequence) and fp32
    greedy answer: (prompt tokens, text)."""
    folder, model = written
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


def test_a_data_url_answers_as_transformers(server: Server, written: tuple[Path, Any]) -> None:
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0)
    response = client.chat.completions.create(
        model=server.model,
        messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": DATA_URL}},
            {"type": "text", "text": QUESTION}]}],
        max_tokens=NUM_TOKENS, temperature=0,
    )  # fmt: skip
    num_prompt, answer = _expected(written)
    assert response.usage is not None and response.usage.prompt_tokens == num_prompt
    assert response.choices[0].message.content == answer
