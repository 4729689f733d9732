"""Images from request content parts: `data:` URLs, http(s) URLs fetched by the server, and
local `file:` URLs under the operator's --allowed-local-media-path; decoded with Pillow.

Every failure is the client's 400 naming the part (`param`), raised before anything reaches the
engine. A fetch is asynchronous (httpx) with a total time limit and a byte limit, follows at
most a few redirects and only to http(s); decoding runs on a worker thread, so neither blocks
other requests.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import io
import os
import urllib.parse
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pagedserve.core.engine_client import EngineClient
from pagedserve.core.multimodal.inputs import content_hash
from pagedserve.openai_compat.common import errors
from pagedserve.openai_compat.common.protocol import ChatMessage, ImageUrl

if TYPE_CHECKING:
    import httpx
    from PIL import Image

FORMATS = ("PNG", "JPEG", "WEBP", "GIF")
MAX_REDIRECTS = 3
MAX_PIXELS = 64 * 1024 * 1024
"""Larger decoded images are refused (Pillow's decompression-bomb guard at this size)."""


@dataclass(frozen=True)
class MediaConfig:
    """Where images may come from and how much of them (the server's flags)."""

    allowed_local_media_path: str | None = None
    fetch_timeout: float = 10.0
    max_bytes: int = 20 * 1024 * 1024
    max_images: int = 8
    """Images one prompt may carry (--limit-mm-per-prompt)."""


@dataclass(frozen=True, eq=False)
class LoadedImage:
    image: Image.Image
    """RGB, fully decoded (a GIF's first frame)."""
    content_hash: bytes


async def load_image(url: str, config: MediaConfig, param: str) -> LoadedImage:
    """The image at `url`, decoded; raises a 400 APIError naming `param`."""
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "data":
        data = _data_url(url, config, param)
    elif scheme in ("http", "https"):
        data = await _fetch(url, config, param)
    elif scheme == "file":
        data = await asyncio.to_thread(_local_file, url, config, param)
    else:
        raise errors.invalid(
            f"Unsupported image URL scheme {scheme or url[:16]!r}: use data:, http(s): or file:.",
            param=param,
        )
    return await asyncio.to_thread(decode_image, data, param)


def _data_url(url: str, config: MediaConfig, param: str) -> bytes:
    head, sep, payload = url.partition(",")
    if not sep or not head.endswith(";base64"):
        raise errors.invalid("A data: image URL must be data:<type>;base64,<data>.", param=param)
    if len(payload) * 3 // 4 > config.max_bytes:
        raise _too_large(config, param)
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise errors.invalid(f"The data: URL is not valid base64: {exc}", param=param) from exc


async def _fetch(url: str, config: MediaConfig, param: str) -> bytes:
    # Here, on the first image URL: httpx with its command line's rich, pygments and click is
    # ~5.6 MiB resident that a server given no image URL never needs (issue 42 item 4).
    import httpx

    try:
        return await asyncio.wait_for(_get(url, config, param), config.fetch_timeout)
    except asyncio.TimeoutError as exc:
        raise errors.invalid(
            f"Fetching the image took longer than {config.fetch_timeout:g} s.", param=param
        ) from exc
    except httpx.HTTPError as exc:
        raise errors.invalid(f"Could not fetch the image: {exc}", param=param) from exc


async def _get(url: str, config: MediaConfig, param: str) -> bytes:
    import httpx  # imported by _fetch, the only caller

    async with httpx.AsyncClient(follow_redirects=False, timeout=config.fetch_timeout) as client:
        for _ in range(MAX_REDIRECTS + 1):
            async with client.stream("GET", url) as response:
                if response.is_redirect:
                    url = str(response.url.join(response.headers.get("location", "")))
                    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
                        raise errors.invalid("The image URL redirects off http(s).", param=param)
                    continue
                if response.status_code != 200:
                    raise errors.invalid(
                        f"Fetching the image answered HTTP {response.status_code}.", param=param
                    )
                return await _body(response, config, param)
    raise errors.invalid(f"The image URL redirects more than {MAX_REDIRECTS} times.", param=param)


async def _body(response: httpx.Response, config: MediaConfig, param: str) -> bytes:
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > config.max_bytes:
        raise _too_large(config, param)
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > config.max_bytes:
            raise _too_large(config, param)
        chunks.append(chunk)
    return b"".join(chunks)


def _local_file(url: str, config: MediaConfig, param: str) -> bytes:
    root = config.allowed_local_media_path
    if root is None:
        raise errors.invalid(
            "file: image URLs are off: the server was not started with --allowed-local-media-path.",
            param=param,
        )
    parts = urllib.parse.urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        raise errors.invalid("A file: image URL must name a local path.", param=param)
    path = Path(os.path.realpath(urllib.parse.unquote(parts.path)))
    allowed = Path(os.path.realpath(root))
    if not path.is_relative_to(allowed) or not path.is_file():
        raise errors.invalid(
            "The file is not a file under the server's --allowed-local-media-path.", param=param
        )
    if path.stat().st_size > config.max_bytes:
        raise _too_large(config, param)
    return path.read_bytes()


def decode_image(data: bytes, param: str) -> LoadedImage:
    """PNG, JPEG, WebP or a GIF's first frame -> RGB; anything else, truncated or corrupt
    data, or a decompression bomb is a 400."""
    from PIL import Image  # here, with the first image: ~2 MiB resident a text server never needs

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=FORMATS)
            if image.width * image.height > MAX_PIXELS:
                raise errors.invalid(
                    f"The image is {image.width}x{image.height}: more than {MAX_PIXELS} pixels.",
                    param=param,
                )
            image.seek(0)
            rgb = image.convert("RGB")  # decodes every byte: a truncated file fails here
    except errors.APIError:
        raise
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombWarning,
            Image.DecompressionBombError) as exc:  # fmt: skip
        raise errors.invalid(
            f"The image could not be decoded (PNG, JPEG, WebP or GIF expected): {exc}",
            param=param,
        ) from exc
    return LoadedImage(rgb, content_hash(rgb.mode, rgb.size, rgb.tobytes()))


def _too_large(config: MediaConfig, param: str) -> errors.APIError:
    return errors.invalid(f"The image is larger than {config.max_bytes} bytes.", param=param)


def image_parts(messages: list[ChatMessage]) -> list[tuple[str, ImageUrl]]:
    """Each image_url part of a conversation, in order, with the param that names it."""
    return [(f"messages[{i}].content[{j}].image_url", image)
            for i, m in enumerate(messages) for j, image in m.image_urls()]  # fmt: skip


async def load_message_images(
    messages: list[ChatMessage], engine: EngineClient, config: MediaConfig
) -> list[LoadedImage]:
    """Every image of a conversation, in order, decoded ([] when it has none); a 400 naming
    the part for an image on a text-only model, too many images, or a part that fails."""
    parts = [(param, image.url) for param, image in image_parts(messages)]
    if not parts:
        return []
    if engine.image_processor is None:
        raise errors.invalid(
            "This model does not take images (a text-only model); send text content only.",
            param=parts[0][0],
        )
    if len(parts) > config.max_images:
        raise errors.invalid(
            f"The prompt has {len(parts)} images; the server takes at most "
            f"{config.max_images} per prompt (--limit-mm-per-prompt).",
            param=parts[config.max_images][0],
        )
    return list(await asyncio.gather(*(load_image(url, config, p) for p, url in parts)))
