"""Images through a real server (`pagedserve serve` on a tiny random Qwen2.5-VL) with real
clients: the OpenAI SDK with a base64 data URL, an http URL served by a loopback server and a
file: URL under --allowed-local-media-path, LangChain's ChatOpenAI with an image content block,
the Anthropic SDK's image blocks on /v1/messages, the built-in chat page in Chromium with an attached file; the answers are transformers' fp32
greedy tokens on the prompt transformers' chat template renders; bad images are 400s naming
the part."""

from __future__ import annotations

import base64
import io
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import openai
import pytest
import torch
from PIL import Image

from bench.common.server import API_KEY, Server, start_server, stop_server
from bench.common.tiny_vlm import MAX_PIXELS, MIN_PIXELS, random_png, write_tiny_qwen2_5_vl

transformers = pytest.importorskip("transformers")

NUM_TOKENS = 8
QUESTION = "What is in the picture?"


PNG = random_png(7, (112, 84))
DATA_URL = "data:image/png;base64," + base64.b64encode(PNG).decode()


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    folder = tmp_path_factory.mktemp("vlm") / "tiny-qwen2.5-vl"
    return folder, write_tiny_qwen2_5_vl(folder, seed=5)


@pytest.fixture(scope="module")
def media_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("media")
    (folder / "photo.png").write_bytes(PNG)
    return folder


@pytest.fixture(scope="module")
def server(written, media_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    flags = [str(written[0]), "--api-key", API_KEY, "--dtype", "float32", "--num-pages", "64",
             "--page-size", "16", "--max-model-len", "512",
             "--allowed-local-media-path", str(media_dir),
             "--limit-mm-per-prompt", '{"image": 2}']  # fmt: skip
    srv = start_server(tmp_path_factory.mktemp("vlm-server"), *flags)
    yield srv
    assert stop_server(srv) == 0, srv.log()


@pytest.fixture(scope="module")
def http_url() -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(len(PNG)))
            self.end_headers()
            self.wfile.write(PNG)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/photo.png"
    httpd.shutdown()


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0)


@pytest.fixture(scope="module")
def expected(written) -> tuple[int, str]:
    """transformers' prompt (its chat template, <|image_pad|> repeated as its processor does)
    and fp32 greedy answer: (prompt tokens, text)."""
    from transformers import AutoTokenizer
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    folder, model = written
    tokenizer = AutoTokenizer.from_pretrained(folder)
    pixels = Qwen2VLImageProcessorPil(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)(
        images=[Image.open(io.BytesIO(PNG))], return_tensors="pt"
    )
    num = int(pixels["image_grid_thw"].prod()) // 4
    content = [{"type": "image"}, {"type": "text", "text": QUESTION}]
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
    )
    text = text.replace("<|image_pad|>", "<|image_pad|>" * num)
    ids = torch.tensor([tokenizer(text, add_special_tokens=False).input_ids])
    image_token = model.config.image_token_id
    with torch.no_grad():
        out = model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=pixels["pixel_values"],
            image_grid_thw=pixels["image_grid_thw"], mm_token_type_ids=(ids == image_token).int(),
            max_new_tokens=NUM_TOKENS, do_sample=False,
        )  # fmt: skip
    answer = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    return ids.shape[1], answer


def _ask(client: openai.OpenAI, server: Server, *urls: str) -> Any:
    parts: list[Any] = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    parts.append({"type": "text", "text": QUESTION})
    return client.chat.completions.create(
        model=server.model, messages=[{"role": "user", "content": parts}],
        max_tokens=NUM_TOKENS, temperature=0,
    )  # fmt: skip


def test_a_data_url_answers_as_transformers(client, server, expected) -> None:
    response = _ask(client, server, DATA_URL)
    assert response.usage.prompt_tokens == expected[0]
    assert response.choices[0].message.content == expected[1]


def test_an_http_url_and_a_local_file_give_the_same_answer(
    client, server, expected, http_url: str, media_dir: Path
) -> None:
    assert _ask(client, server, http_url).choices[0].message.content == expected[1]
    local = (media_dir / "photo.png").as_uri()
    assert _ask(client, server, local).choices[0].message.content == expected[1]


def test_langchain_image_content_block(server: Server, expected) -> None:
    from langchain_core.messages import HumanMessage
    from langchain_openai import ChatOpenAI

    chat = ChatOpenAI(base_url=server.base_url + "/v1", api_key=API_KEY, model=server.model,
                      temperature=0, max_tokens=NUM_TOKENS, max_retries=0)  # fmt: skip
    message = HumanMessage(content=[
        {"type": "image_url", "image_url": {"url": DATA_URL}},
        {"type": "text", "text": QUESTION},
    ])  # fmt: skip
    assert chat.invoke([message]).content == expected[1]


@pytest.mark.parametrize(
    "urls, param, words",
    [
        (["data:image/png;base64,iVBORw0KGgo="], "messages[0].content[0].image_url", "decoded"),
        (["ftp://example.com/a.png"], "messages[0].content[0].image_url", "scheme"),
        (["file:///etc/hostname"], "messages[0].content[0].image_url", "allowed-local"),
        ([DATA_URL] * 3, "messages[0].content[2].image_url", "at most 2"),
    ],
)
def test_bad_images_are_400s_naming_the_part(client, server, urls, param, words) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        _ask(client, server, *urls)
    error = info.value.body
    assert isinstance(error, dict) and error["param"] == param and words in error["message"]


def test_responses_input_image_answers_as_chat(client, server, expected) -> None:
    content = [{"type": "input_image", "image_url": DATA_URL, "detail": "auto"},
               {"type": "input_text", "text": QUESTION}]  # fmt: skip
    response = client.responses.create(
        model=server.model, input=[{"role": "user", "content": content}],
        max_output_tokens=NUM_TOKENS, temperature=0,
    )  # fmt: skip
    assert response.usage is not None and response.usage.input_tokens == expected[0]
    assert response.output_text == expected[1]
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model=server.model, input=[{"role": "user", "content": [
            {"type": "input_image", "image_url": "ftp://example.com/a.png"}]}])  # fmt: skip
    assert isinstance(info.value.body, dict) and info.value.body["param"] == "input"
    assert "input_image" in info.value.body["message"]


def test_the_chat_page_attaches_an_image_and_answers_as_transformers(
    server: Server, expected, media_dir: Path
) -> None:
    from tests.openai_compat.ui_browser import (
        Console,
        chromium,
        enter_key,
        find_chromium,
        screenshot,
        wait_answer,
    )

    executable = find_chromium()
    if executable is None:
        pytest.skip("no Chromium found (apt-get install chromium, or set PAGEDSERVE_CHROMIUM)")
    with chromium(executable) as browser:
        page = browser.new_page()
        console = Console(page)
        sent: list[Any] = []
        page.on("request", lambda r: sent.append(r.post_data_json)
                if r.url.endswith("/v1/chat/completions") else None)  # fmt: skip
        page.goto(server.base_url + "/")
        enter_key(page, API_KEY)
        page.wait_for_selector("#attach:not([hidden])")  # the model takes images
        page.set_input_files("#attach-input", str(media_dir / "photo.png"))
        page.wait_for_selector("#attachments:not([hidden]) img")
        page.fill("#temperature", "0")
        page.fill("#max_tokens", str(NUM_TOKENS))
        page.fill("#prompt", QUESTION)
        page.press("#prompt", "Enter")
        assert wait_answer(page) == expected[1]
        screenshot(page, "chat-image")
        # The file went as the SDK sends one: a data: URL of its bytes, then the question.
        assert sent[-1]["messages"] == [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": DATA_URL}},
            {"type": "text", "text": QUESTION}]}]  # fmt: skip
        assert page.get_attribute(".message.user .images img", "src") == DATA_URL
        assert page.is_hidden("#attachments")  # sent, so no longer pending
        assert console.errors == []


def test_anthropic_image_blocks_answer_as_chat(server: Server, expected, http_url: str) -> None:
    import anthropic

    client = anthropic.Anthropic(base_url=server.base_url, api_key=API_KEY, max_retries=0)
    data = base64.b64encode(PNG).decode()
    for source in ({"type": "base64", "media_type": "image/png", "data": data},
                   {"type": "url", "url": http_url}):  # fmt: skip
        messages: Any = [{"role": "user", "content": [
            {"type": "image", "source": source}, {"type": "text", "text": QUESTION}]}]  # fmt: skip
        reply = client.messages.create(model=server.model, max_tokens=NUM_TOKENS,
                                       messages=messages, extra_body={"temperature": 0})  # fmt: skip
        # Anthropic counts the prefix cache's tokens apart (the same image hits it)
        usage = reply.usage
        assert usage.input_tokens + (usage.cache_read_input_tokens or 0) == expected[0]
        assert [b.text for b in reply.content if b.type == "text"] == [expected[1]]
        count = client.messages.count_tokens(model=server.model, messages=messages)
        assert count.input_tokens == expected[0]
    # A bad image names its block, in Anthropic's envelope; the text before it does not count.
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(model=server.model, max_tokens=NUM_TOKENS, messages=[
            {"role": "user", "content": [{"type": "text", "text": QUESTION}, {"type": "image",
             "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}])  # fmt: skip
    body = info.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert body["error"]["message"].startswith("messages[0].content[1]: "), body
    assert "decoded" in body["error"]["message"], body
