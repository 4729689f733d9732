"""Images from content parts (openai_compat/common/media.py): data: URLs of each format,
http(s) URLs from a real loopback server (limits, redirects), file: URLs under the allowed
directory; every failure a 400 naming the part."""

from __future__ import annotations

import asyncio
import base64
import io
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from PIL import Image

from pagedserve.openai_compat.common.errors import APIError
from pagedserve.openai_compat.common.media import LoadedImage, MediaConfig, load_image

PARAM = "messages[0].content[1].image_url"


def encoded(fmt: str, size: tuple[int, int] = (20, 12), frames: int = 1) -> bytes:
    colors = [(200, 10, 30), (10, 200, 30), (10, 30, 200)]
    images = [Image.new("RGB", size, colors[i % 3]) for i in range(frames)]
    buf = io.BytesIO()
    if frames > 1:
        images[0].save(buf, fmt, save_all=True, append_images=images[1:])
    else:
        images[0].save(buf, fmt)
    return buf.getvalue()


def data_url(data: bytes, kind: str = "image/png") -> str:
    return f"data:{kind};base64,{base64.b64encode(data).decode()}"


def load(url: str, config: MediaConfig | None = None) -> LoadedImage:
    return asyncio.run(load_image(url, config or MediaConfig(), PARAM))


def refused(url: str, config: MediaConfig | None = None) -> APIError:
    with pytest.raises(APIError) as info:
        load(url, config)
    assert info.value.status == 400 and info.value.param == PARAM, info.value
    return info.value


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF"])
def test_data_urls_of_each_format_decode(fmt: str) -> None:
    image = load(data_url(encoded(fmt)))
    assert image.image.mode == "RGB" and image.image.size == (20, 12)
    assert len(image.content_hash) == 16


def test_gif_takes_its_first_frame() -> None:
    first = load(data_url(encoded("GIF", frames=3))).image
    assert first.getpixel((0, 0))[0] > 150  # the red first frame, not a later one


def test_the_hash_follows_the_pixels_not_the_file() -> None:
    png, webp = encoded("PNG"), encoded("WEBP", size=(20, 12))
    assert load(data_url(png)).content_hash == load(data_url(png)).content_hash
    other = Image.new("RGB", (20, 12), (0, 0, 0))
    buf = io.BytesIO()
    other.save(buf, "PNG")
    assert load(data_url(png)).content_hash != load(data_url(buf.getvalue())).content_hash
    assert load(data_url(webp)).content_hash  # lossy, still decodes


@pytest.mark.parametrize(
    "url, words",
    [
        (data_url(encoded("PNG")[:60]), "could not be decoded"),  # truncated
        (data_url(b"not an image at all"), "could not be decoded"),
        (data_url(encoded("BMP")), "could not be decoded"),  # not a format we take
        ("data:image/png;base64,@@@", "base64"),
        ("data:image/png,plain", "base64"),
        ("ftp://example.com/a.png", "scheme"),
        ("gopher:x", "scheme"),
        ("file:///etc/hostname", "allowed-local-media-path"),
    ],
)
def test_bad_urls_are_400s_naming_the_part(url: str, words: str) -> None:
    assert words in refused(url).message


def test_a_data_url_over_the_size_limit() -> None:
    error = refused(data_url(encoded("PNG", (64, 64))), MediaConfig(max_bytes=64))
    assert "larger than 64 bytes" in error.message


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        png = encoded("PNG")
        routes = {
            "/ok.png": (200, {"Content-Type": "image/png"}, png),
            "/missing.png": (404, {}, b"no"),
            "/to-ok": (302, {"Location": "/ok.png"}, b""),
            "/to-file": (302, {"Location": "file:///etc/passwd"}, b""),
            "/loop": (302, {"Location": "/loop"}, b""),
            "/big": (200, {}, b"\x89PNG" + b"0" * 5000),
        }
        if self.path == "/slow":
            time.sleep(2)
        status, headers, body = routes.get(self.path, (200, {}, png))
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def http_base() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_http_urls_are_fetched(http_base: str) -> None:
    assert load(f"{http_base}/ok.png").image.size == (20, 12)
    assert load(f"{http_base}/to-ok").image.size == (20, 12)  # an http redirect is followed


@pytest.mark.parametrize(
    "path, config, words",
    [
        ("/missing.png", MediaConfig(), "HTTP 404"),
        ("/to-file", MediaConfig(), "redirects off http"),
        ("/loop", MediaConfig(), "redirects more than"),
        ("/big", MediaConfig(max_bytes=1000), "larger than 1000 bytes"),
        ("/slow", MediaConfig(fetch_timeout=0.3), "longer than 0.3 s"),
    ],
)
def test_http_failures_are_400s(http_base: str, path: str, config: MediaConfig, words: str) -> None:
    assert words in refused(f"{http_base}{path}", config).message


def test_a_slow_fetch_does_not_block_the_event_loop(http_base: str) -> None:
    async def both() -> tuple[float, float]:
        start = time.monotonic()
        fetch = asyncio.create_task(load_image(f"{http_base}/slow", MediaConfig(), PARAM))
        await asyncio.sleep(0.05)
        ticked = time.monotonic() - start  # the loop ran other work meanwhile
        await fetch
        return ticked, time.monotonic() - start

    ticked, total = asyncio.run(both())
    assert ticked < 0.5 < 1.5 < total


def test_file_urls_only_under_the_allowed_directory(tmp_path: Path) -> None:
    allowed = tmp_path / "media"
    allowed.mkdir()
    (allowed / "a.png").write_bytes(encoded("PNG"))
    (tmp_path / "secret.png").write_bytes(encoded("PNG"))
    (allowed / "link.png").symlink_to(tmp_path / "secret.png")
    config = MediaConfig(allowed_local_media_path=str(allowed))
    assert load((allowed / "a.png").as_uri(), config).image.size == (20, 12)
    for outside in [tmp_path / "secret.png", allowed / "link.png", allowed / ".." / "secret.png"]:
        assert "allowed-local-media-path" in refused(f"file://{outside}", config).message
    assert "allowed-local-media-path" in refused((allowed / "nope.png").as_uri(), config).message
