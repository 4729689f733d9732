"""The page on an embedding server (issue 25), in headless Chromium over the fake engine: it says
chat is unavailable and offers no composer; on a generation server it stays as it was. Skipped
where no Chromium is installed, as test_ui_browser.py is."""

from __future__ import annotations

import dataclasses

import pytest
from playwright.sync_api import BrowserContext

from tests.openai_compat import test_ui_browser
from tests.openai_compat.fake_engine import FakeEngine
from tests.openai_compat.test_disconnect_fake import LiveServer
from tests.openai_compat.ui_browser import Console

browser = test_ui_browser.browser  # its headless Chromium fixture (skips without Chromium)


@pytest.mark.parametrize("task", ["embed", "generate"])
def test_the_page_says_whether_chat_is_available(browser: BrowserContext, task: str) -> None:
    engine = FakeEngine()
    engine.model_info = dataclasses.replace(engine.model_info, task=task)
    server = LiveServer(engine)
    page = browser.new_page()
    try:
        console = Console(page)
        page.goto(server.base + "/")
        page.wait_for_function(
            "() => document.getElementById('model-name').textContent === 'fake-model'"
        )
        notice = page.locator("#chat-unavailable")
        assert notice.is_visible() == (task == "embed")
        assert page.locator("#composer").is_visible() == (task == "generate")
        if task == "embed":
            assert "/v1/embeddings" in (notice.text_content() or "")
        assert page.locator("#live").is_visible()  # the server view stays
        assert console.errors == []
    finally:
        page.close()
        server.stop()
        server.join()
