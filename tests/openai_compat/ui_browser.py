"""Chromium through Playwright for the page's tests (issue 17).

Playwright's own browser download cannot reach these machines, so the tests drive the system's
Chromium (Debian's `chromium`, installed by scripts/install.sh in test mode) through
`executable_path`, headless, with a fresh profile and every background network feature off.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from playwright.sync_api import BrowserContext, ConsoleMessage, Page, sync_playwright

CHROMIUM_ENV = "PAGEDSERVE_CHROMIUM"
"""A Chromium or Chrome binary to use instead of the first one found on PATH."""
CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
ARGS = [
    "--no-sandbox",  # CI runs as root, where Chromium's sandbox refuses to start
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SCREENSHOT_DIR = Path(
    os.environ.get("PAGEDSERVE_SCREENSHOTS", Path(__file__).parents[2] / "build" / "screenshots")
)
"""Where the run saves its screenshots (build/ is git-ignored; the README's copies live in
docs/images/)."""


def find_chromium() -> str | None:
    configured = os.environ.get(CHROMIUM_ENV)
    if configured:
        return configured if Path(configured).exists() else None
    for name in CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


@contextmanager
def chromium(executable: str) -> Iterator[BrowserContext]:
    """One headless browser with a fresh profile, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="pagedserve-chromium-") as profile:
        with sync_playwright() as playwright:
            context = playwright.chromium.launch_persistent_context(
                profile,
                executable_path=executable,
                headless=True,
                args=ARGS,
                viewport={"width": 1200, "height": 760},
            )
            try:
                yield context
            finally:
                context.close()


class Console:
    """Collects what a page reports as broken: console errors and uncaught exceptions."""

    def __init__(self, page: Page) -> None:
        self.errors: list[str] = []
        page.on("console", self._console)
        page.on("pageerror", lambda exc: self.errors.append(f"pageerror: {exc}"))

    def _console(self, message: ConsoleMessage) -> None:
        if message.type == "error":
            self.errors.append(f"console: {message.text} at {message.location}")


def screenshot(page: Page, name: str) -> Path:
    SCREENSHOT_DIR.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOT_DIR / f"{name}.png"
    page.screenshot(path=str(path))
    return path


def enter_key(page: Page, key: str) -> None:
    page.wait_for_selector("#key-dialog[open]")
    page.fill("#key-input", key)
    page.click("#key-form button")


def wait_answer(page: Page, count: int = 1, timeout_s: float = 120.0) -> str:
    """The raw text of the last answer once `count` answers have finished streaming."""
    page.wait_for_function(
        "n => document.querySelectorAll('.message.assistant:not(.streaming)').length === n "
        "&& !document.querySelector('.message.streaming')",
        arg=count,
        timeout=timeout_s * 1000,
    )
    return page.locator(".message.assistant").last.get_attribute("data-text") or ""
