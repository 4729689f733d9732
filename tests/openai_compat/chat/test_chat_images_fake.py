"""image_url parts in /v1/chat/completions over the fake engine: what reaches the engine (the
image's tokens expanded to hash-derived placeholder ids, its features beside them) and the
400s, each naming the part, with nothing reaching the engine."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator

import pytest
from PIL import Image
from starlette.testclient import TestClient

from pagedserve.core.multimodal.processor import Qwen2VLImageProcessor
from pagedserve.core.tokenizers.chat_template import ChatTemplate
from pagedserve.openai_compat.server_config import ServerConfig
from tests.openai_compat.fake_app import fake_client
from tests.openai_compat.fake_engine import FakeEngine

IMAGE_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for p in m['content'] %}{% if p['type'] == 'image' %}#"
    "{% else %}{{ p['text'] }}{% endif %}{% endfor %}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
"""The fake engine's tag template, writing '#' (its image token) for each image part."""


def png(size: tuple[int, int] = (56, 56), color: tuple[int, int, int] = (9, 99, 199)) -> str:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def image_part(url: str, detail: str | None = None) -> dict:
    part: dict = {"type": "image_url", "image_url": {"url": url}}
    if detail is not None:
        part["image_url"]["detail"] = detail
    return part


def ask(client: TestClient, *parts: dict) -> dict:
    content = [{"type": "text", "text": "see:"}, *parts]
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 2}
    response = client.post("/v1/chat/completions", json=body)
    return {"status": response.status_code, **response.json()}


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def vision_engine() -> FakeEngine:
    engine = FakeEngine()
    engine.image_processor = Qwen2VLImageProcessor(ord("#"), max_pixels=56 * 56)
    engine.chat_template = ChatTemplate(IMAGE_TEMPLATE, bos_token=None, eos_token=None)
    return engine


@pytest.fixture
def text_client(engine: FakeEngine) -> Iterator[TestClient]:
    yield from fake_client(engine)


@pytest.fixture
def client(vision_engine: FakeEngine) -> Iterator[TestClient]:
    yield from fake_client(vision_engine, ServerConfig(limit_mm_per_prompt=2))


def assert_400(answer: dict, param: str, words: str) -> None:
    assert answer["status"] == 400, answer
    error = answer["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    assert words in error["message"], error


def test_an_image_on_a_text_only_model_is_a_400(text_client: TestClient, engine) -> None:
    answer = ask(text_client, image_part(png()))
    assert_400(answer, "messages[0].content[1].image_url", "does not take images")
    assert engine.seen_prompts == []


def test_the_image_reaches_the_engine_as_placeholder_tokens(client, vision_engine) -> None:
    answer = ask(client, image_part(png(), detail="high"))
    assert answer["status"] == 200, answer
    [prompt] = vision_engine.seen_prompts
    [mm] = vision_engine.seen_multimodal
    assert mm is not None and len(mm.images) == 1
    [(start, end)] = mm.spans()
    assert end - start == mm.images[0].num_tokens == 4  # 56 x 56: 4 x 4 patches, merged 2 x 2
    text = b"<user>see:#<assistant>"
    assert prompt[:start] == list(text[: text.index(b"#")])
    assert all(t >= 257 for t in prompt[start:end]) and len(set(prompt[start:end])) == 4
    assert prompt[end:] == list(b"<assistant>")
    assert answer["usage"]["prompt_tokens"] == len(prompt)


def test_the_same_image_gives_the_same_ids_another_image_others(client, vision_engine) -> None:
    for color in [(1, 2, 3), (1, 2, 3), (3, 2, 1)]:
        assert ask(client, image_part(png(color=color)))["status"] == 200
    first, again, other = vision_engine.seen_prompts
    assert first == again and first != other and len(first) == len(other)


def test_several_images_in_order(client, vision_engine) -> None:
    answer = ask(client, image_part(png((56, 56))), image_part(png((112, 56))))
    assert answer["status"] == 200, answer
    [mm] = vision_engine.seen_multimodal
    assert mm is not None and [im.grid_thw for im in mm.images] == [(1, 4, 4), (1, 2, 4)]


@pytest.mark.parametrize(
    "url, words",
    [
        ("data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n").decode(), "decoded"),
        ("ftp://example.com/x.png", "scheme"),
        ("file:///etc/hostname", "allowed-local-media-path"),
    ],
)
def test_a_bad_image_is_a_400_before_the_engine(client, vision_engine, url, words) -> None:
    answer = ask(client, image_part(png()), image_part(url))
    assert_400(answer, "messages[0].content[2].image_url", words)
    assert vision_engine.seen_prompts == []


def test_more_images_than_the_limit(client, vision_engine) -> None:
    answer = ask(client, *[image_part(png()) for _ in range(3)])
    assert_400(answer, "messages[0].content[3].image_url", "--limit-mm-per-prompt")
    assert vision_engine.seen_prompts == []


def test_a_bad_detail_is_refused_by_the_schema(client) -> None:
    answer = ask(client, image_part(png(), detail="ultra"))
    assert answer["status"] == 400, answer
    assert answer["error"]["param"].startswith("messages[0].content"), answer


def test_an_image_whose_tokens_exceed_the_context(vision_engine: FakeEngine) -> None:
    vision_engine.image_processor = Qwen2VLImageProcessor(ord("#"))  # 448 x 448: 256 tokens
    for client in fake_client(vision_engine):
        answer = ask(client, image_part(png((448, 448))))
        assert_400(answer, "messages", "do not fit")
        assert answer["error"]["code"] == "context_length_exceeded"
