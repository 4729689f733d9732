"""The built-in page at `/`: a chat with the served model and a live view of the server (issue 17).

Plain HTML/CSS/JS under `static/`, no build step and nothing fetched from elsewhere. The page and
everything under /ui/ are open (the browser fetches them before it can know a key); every API
call the page makes carries the key, which the page asks for once and keeps for the tab
(sessionStorage). `/ui/info` tells the page whether a key is needed (so it asks before its first
call instead of after a 401) and what /metrics does not say: dtype, device, max_model_len, and
whether the model takes images (the page offers to attach them only then, at most
--limit-mm-per-prompt per request). None of it is more than /metrics or a refused request
already shows without a key.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from pagedserve import __version__
from pagedserve.openai_compat.common.http_responses import JSONResponse

if TYPE_CHECKING:
    from pagedserve.openai_compat.state import ServerState

STATIC_DIR = Path(__file__).parent / "static"
OPEN_PREFIX = "/ui/"
"""The page's own files: served without the API key, like `/` itself."""

# Scripts and styles from this server only, and nothing inline: even if model output ever slipped
# past the renderer into the DOM, the browser would not run it.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}


async def index(request: Request) -> Response:
    return FileResponse(STATIC_DIR / "index.html", headers=HEADERS)


async def info(request: Request) -> Response:
    state: ServerState = request.app.state.server
    base = {"api_key_required": state.config.api_key is not None, "version": __version__}
    if state.ctx is None or state.engine is None or state.engine.errored:
        return JSONResponse({**base, "ready": False})
    model = state.ctx.engine.model_info
    facts: dict[str, Any] = {
        "ready": True,
        "model": state.ctx.model_name,
        "root": model.name,
        "dtype": model.dtype,
        "device": model.device,
        "page_size": model.page_size,
        "num_pages": model.num_pages,
        "max_model_len": model.max_model_len,
        "images": state.ctx.engine.image_processor is not None,
        "max_images": state.config.limit_mm_per_prompt,
    }
    return JSONResponse({**base, **facts})


class _StaticFiles(StaticFiles):
    """StaticFiles with the page's security headers on every file."""

    def file_response(self, *args: Any, **kwargs: Any) -> Response:
        response = super().file_response(*args, **kwargs)
        response.headers.update(HEADERS)
        return response


def ui_routes() -> list[BaseRoute]:
    return [
        Route("/", index, methods=["GET", "HEAD"]),
        Route(OPEN_PREFIX + "info", info, methods=["GET"]),
        Mount(OPEN_PREFIX.rstrip("/"), app=_StaticFiles(directory=STATIC_DIR), name="ui"),
    ]
