"""The page's HTTP side (issue 17), over a fake engine: `/` and /ui/ open even with an API key,
the API still closed, security headers, `--no-ui`, nothing fetched from elsewhere, and no
HTML-building call in the page's scripts. The page itself runs in test_ui_browser.py."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import pytest
from starlette.testclient import TestClient

from pagedserve.openai_compat.app import create_app
from pagedserve.openai_compat.server_config import ServerConfig
from pagedserve.openai_compat.ui import STATIC_DIR
from tests.openai_compat.fake_engine import FakeEngine
from tests.openai_compat.test_cli import _configs

KEY = "sekret"
PAGE_FILES = ("/", "/ui/main.js", "/ui/api.js", "/ui/chat.js", "/ui/live.js", "/ui/charts.js",
              "/ui/markdown.js", "/ui/style.css", "/ui/favicon.svg")  # fmt: skip


def _client(config: ServerConfig) -> Iterator[TestClient]:
    with TestClient(create_app(config, FakeEngine)) as client:
        for _ in range(200):
            if client.get("/health").status_code == 200:
                break
            time.sleep(0.01)
        yield client


@pytest.fixture
def keyed() -> Iterator[TestClient]:
    yield from _client(ServerConfig(api_key=KEY))


def test_page_and_its_files_are_open_while_the_api_wants_the_key(keyed: TestClient) -> None:
    for path in PAGE_FILES:
        response = keyed.get(path)
        assert response.status_code == 200, path
        assert "default-src 'self'" in response.headers["content-security-policy"], path
        assert response.headers["x-content-type-options"] == "nosniff"
    assert keyed.get("/").headers["content-type"].startswith("text/html")
    assert keyed.get("/ui/main.js").headers["content-type"].startswith("text/javascript")
    for path in ("/v1/models", "/version", "/openapi.json"):
        assert keyed.get(path).status_code == 401, path
    assert keyed.get("/ui/missing.js").status_code == 404
    assert keyed.get("/ui/%2e%2e/app.py").status_code == 404  # no way out of static/


def test_info_says_whether_a_key_is_needed_and_what_is_served(keyed: TestClient) -> None:
    info = keyed.get("/ui/info").json()
    assert info["api_key_required"] is True and info["ready"] is True
    assert (info["model"], info["page_size"], info["num_pages"], info["max_model_len"]) == (
        "fake-model", 16, 8, 64)  # fmt: skip
    assert (info["images"], info["max_images"]) == (False, 8)  # a text-only model


def test_info_while_the_model_loads() -> None:
    def slow() -> FakeEngine:
        time.sleep(0.5)
        return FakeEngine()

    with TestClient(create_app(ServerConfig(), slow)) as client:
        assert client.get("/ui/info").json() == {
            "api_key_required": False, "version": client.get("/version").json()["version"],
            "ready": False}  # fmt: skip


def test_no_ui_serves_no_page() -> None:
    for client in _client(ServerConfig(ui=False)):
        for path in (*PAGE_FILES, "/ui/info"):
            assert client.get(path).status_code == 404, path
        assert client.get("/v1/models").status_code == 200


def test_no_ui_flag() -> None:
    assert _configs([])[0].ui is True
    assert _configs(["--no-ui"])[0].ui is False


def test_nothing_comes_from_elsewhere() -> None:
    """No CDN: every src/href/import/url() in the page's files is relative."""
    pattern = re.compile(r"""(?:src|href)=["']([^"']+)|from\s+["']([^"']+)|url\(([^)]+)\)""")
    for path in STATIC_DIR.iterdir():
        for match in pattern.finditer(path.read_text()):
            target = next(g for g in match.groups() if g)
            assert "//" not in target and not target.startswith("/"), (path.name, target)


def test_scripts_never_build_html_from_strings() -> None:
    """Text reaches the DOM as Text nodes only (the browser test proves it for model output)."""
    forbidden = re.compile(r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|\beval\(|"
                           r"new Function")  # fmt: skip
    for path in STATIC_DIR.glob("*.js"):
        code = re.sub(r"//.*", "", path.read_text())  # comments may name them
        assert not forbidden.search(code), path.name
