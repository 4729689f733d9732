"""The page at `/` in a real browser (issue 17): headless Chromium (Playwright) against a real
`pagedserve serve` process on the default model (the session's `server`, started with an API
key), and against the app with a scripted fake engine for the HTML-injection check.

Skipped, with the reason, only where no Chromium is installed (scripts/install.sh test puts
Debian's there). Each generation is short; the whole module takes a few seconds of decode.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from collections.abc import AsyncIterator, Iterator

import pytest
from playwright.sync_api import BrowserContext, Page, Response, Route

from bench.common.server import API_KEY, Server
from pagedserve.core.outputs import CompletionOutput, RequestOutput
from pagedserve.core.sampling_params import SamplingParams
from tests.openai_compat.fake_engine import FakeEngine
from tests.openai_compat.test_disconnect_fake import LiveServer
from tests.openai_compat.ui_browser import (
    Console,
    chromium,
    enter_key,
    find_chromium,
    screenshot,
    wait_answer,
)
from tests.reliability.conftest import wait_idle

KEY_NAME = "pagedserve.apiKey"  # the page's sessionStorage entry (static/api.js)
# Predicates passed to wait_for_function are arrow functions: a bare expression would be
# evaluated with eval() inside the page, which its Content-Security-Policy forbids.


@pytest.fixture(scope="module")
def browser() -> Iterator[BrowserContext]:
    executable = find_chromium()
    if executable is None:
        pytest.skip("no Chromium found (apt-get install chromium, or set PAGEDSERVE_CHROMIUM)")
    with chromium(executable) as context:
        context.grant_permissions(["clipboard-read", "clipboard-write"])
        yield context


@pytest.fixture
def page(browser: BrowserContext) -> Iterator[Page]:
    page = browser.new_page()  # a new tab: its own sessionStorage
    yield page
    page.close()


def open_ready(page: Page, server: Server) -> None:
    page.goto(server.base_url + "/")
    enter_key(page, API_KEY)
    page.wait_for_function(
        "name => document.getElementById('model-name').textContent === name", arg=server.model
    )


def send(page: Page, text: str, max_tokens: int, temperature: float = 0.0) -> None:
    page.fill("#temperature", str(temperature))
    page.fill("#max_tokens", str(max_tokens))
    page.fill("#prompt", text)
    page.press("#prompt", "Enter")


def test_key_is_asked_once_then_the_page_shows_the_server(page: Page, server: Server) -> None:
    console = Console(page)
    responses: list[tuple[str, int, str | None]] = []
    page.on("response", lambda r: responses.append((r.url, r.status, r.request.headers.get(
        "authorization"))))  # fmt: skip
    page.goto(server.base_url + "/")
    page.wait_for_selector("#key-dialog[open]")
    # The page and its files came without a key, and nothing was refused before asking.
    assert [r for r in responses if r[1] != 200] == [], responses
    assert {url.rsplit("/", 1)[-1] for url, _, auth in responses if auth is None} >= {
        "", "main.js", "chat.js", "markdown.js", "style.css", "info"}  # fmt: skip
    enter_key(page, API_KEY)
    page.wait_for_function("() => document.getElementById('fact-max-len').textContent === '1024'")
    page.wait_for_function(
        "n => document.getElementById('model-name').textContent === n", arg=server.model
    )
    assert page.text_content("#fact-pages") == "512 x 16 tokens = 8192 tokens"
    assert page.text_content("#fact-dtype") in ("bfloat16 on cpu", "float32 on cpu")
    assert page.is_hidden("#attach")  # a text-only model: no images offered
    page.wait_for_selector("#health[data-state='ok']")
    models = [r for r in responses if r[0].endswith("/v1/models")]
    assert models and all(auth == f"Bearer {API_KEY}" for _, _, auth in models), models
    assert page.evaluate(f"sessionStorage.getItem('{KEY_NAME}')") == API_KEY
    assert page.evaluate("localStorage.length") == 0  # kept for the tab only
    assert console.errors == []


def test_a_refused_key_is_asked_again_and_a_new_tab_asks_anew(
    browser: BrowserContext, page: Page, server: Server
) -> None:
    page.goto(server.base_url + "/")
    enter_key(page, "not-the-key")
    page.wait_for_selector("#key-dialog[open] #key-error:not([hidden])")
    enter_key(page, API_KEY)
    page.wait_for_function(
        "n => document.getElementById('model-name').textContent === n", arg=server.model
    )
    other = browser.new_page()
    try:
        other.goto(server.base_url + "/")
        other.wait_for_selector("#key-dialog[open]")  # sessionStorage is per tab
        assert other.evaluate(f"sessionStorage.getItem('{KEY_NAME}')") is None
    finally:
        other.close()


GROWTH = """() => {
  window.__lengths = [];
  new MutationObserver(() => {
    const body = document.querySelector('.message.assistant .body');
    if (body) window.__lengths.push(body.textContent.length);
  }).observe(document.getElementById('messages'),
             {subtree: true, childList: true, characterData: true});
}"""


def streamed_text(response: Response) -> tuple[str, int]:
    """The content deltas of a chat SSE body, joined, and its usage's completion_tokens."""
    text, tokens = "", 0
    for frame in response.text().split("\n\n"):
        if not frame.startswith("data: {"):
            continue
        chunk = json.loads(frame.removeprefix("data: "))
        for choice in chunk["choices"]:
            text += choice["delta"].get("content") or ""
        tokens = (chunk.get("usage") or {}).get("completion_tokens", tokens)
    return text, tokens


PROMPT = "Give me three tips for better sleep."  # SmolLM2 answers with a Markdown list


def test_an_answer_streams_token_by_token_then_regenerate_and_copy(
    page: Page, server: Server
) -> None:
    console = Console(page)
    open_ready(page, server)
    page.evaluate(GROWTH)
    with page.expect_response("**/v1/chat/completions") as response:
        send(page, PROMPT, max_tokens=48)
    text = wait_answer(page)
    lengths = page.evaluate("window.__lengths")
    assert len({n for n in lengths if n}) >= 3, lengths  # the DOM grew over several frames
    assert (text, 48) == streamed_text(response.value)  # all of what the server sent, as sent
    stats = page.text_content(".message.assistant .stats") or ""
    assert re.fullmatch(r"TTFT \d+\.\d\d s · \d+\.\d tok/s · 48 tokens", stats), stats
    screenshot(page, "chat")

    page.fill("#max_tokens", "12")  # regenerate uses the settings as they are now
    page.fill("#system", "You answer briefly.")
    with page.expect_response("**/v1/chat/completions") as again:
        page.click(".message.assistant .regenerate")
    regenerated = wait_answer(page)
    assert (regenerated, 12) == streamed_text(again.value)
    assert page.locator(".message.assistant").count() == 1  # in place of the first answer
    assert json.loads(again.value.request.post_data or "")["messages"] == [
        {"role": "system", "content": "You answer briefly."},
        {"role": "user", "content": PROMPT},
    ]  # the system prompt leads; the first answer left the history
    page.click(".message.assistant .copy")
    page.wait_for_function("t => navigator.clipboard.readText().then(c => c === t)",
                           arg=regenerated)  # fmt: skip
    assert console.errors == []


def _ignore_eos(route: Route) -> None:
    """A long answer whatever the model would say: the page's request plus ignore_eos."""
    body = json.loads(route.request.post_data or "{}")
    route.continue_(post_data=json.dumps({**body, "ignore_eos": True}))


def kv_usage(page: Page) -> float:
    return float(page.get_attribute("#now-kv", "data-value") or 0)


def test_live_view_follows_a_long_answer_and_stop_aborts_it(page: Page, server: Server) -> None:
    open_ready(page, server)
    page.route("**/v1/chat/completions", _ignore_eos)
    send(page, "Tell me a long story about a lighthouse keeper.", max_tokens=600)
    page.wait_for_function("() => Number(document.getElementById('now-kv').dataset.value) > 0",
                           timeout=60_000)  # fmt: skip
    first = kv_usage(page)
    page.wait_for_function(  # a page further: 16 more tokens
        "v => Number(document.getElementById('now-kv').dataset.value) > v",
        arg=first,
        timeout=60_000,
    )
    page.wait_for_selector("#now-running[data-value='1']")
    page.click("#stop")
    wait_answer(page)
    assert "stopped" in (page.text_content(".message.assistant .stats") or "")
    # Running drops when the stream closes (the event loop's count); the pages are freed when
    # the engine thread applies the abort, a moment later on a loaded machine.
    busy = wait_idle(server, timeout_s=30)
    assert not any(busy.values()), busy  # nothing running, the aborted request's pages free
    page.wait_for_selector("#now-running[data-value='0']")
    screenshot(page, "live")  # the charts hold the whole answer, rise and release
    page.click("#clear")  # "New chat"
    assert page.locator("#messages > li").count() == 0


ANSWER = (
    'Here: <script>window.__xss = 1</script> and <img src=x onerror="window.__xss = 2">\n'
    "**bold** [bad](javascript:window.__xss=3) [good](https://example.com/)\n"
    '```\n<b onmouseover="window.__xss = 4">code</b>\n```\n'
)


class ScriptedEngine(FakeEngine):
    """Answers every request with ANSWER, one character per token."""

    async def _outputs(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams
    ) -> AsyncIterator[RequestOutput]:
        for i, char in enumerate(ANSWER):
            await asyncio.sleep(self.token_delay)
            last = i == len(ANSWER) - 1
            out = CompletionOutput(0, char, [ord(char) % 256], None, "stop" if last else None)
            yield RequestOutput(request_id, prompt_token_ids, [out], last)


@pytest.fixture(scope="module")
def scripted() -> Iterator[str]:
    engine = ScriptedEngine(token_delay=0.002)
    engine.model_info = dataclasses.replace(engine.model_info, max_model_len=10_000)
    server = LiveServer(engine)
    yield server.base
    server.stop()
    server.join()


def test_model_output_cannot_inject_html(page: Page, scripted: str) -> None:
    console = Console(page)
    page.goto(scripted + "/")
    page.wait_for_function(
        "() => document.getElementById('model-name').textContent === 'fake-model'"
    )
    send(page, '<img src=y onerror="window.__xss = 5">', max_tokens=512)
    assert wait_answer(page) == ANSWER
    page.wait_for_timeout(200)  # time for an injected handler to fire, were there one
    assert page.evaluate("window.__xss") is None
    messages = page.locator("#messages")
    assert messages.locator("script, img, iframe, [onerror], [onmouseover]").count() == 0
    body = page.locator(".message.assistant .body")
    assert "<script>window.__xss = 1</script>" in (body.text_content() or "")
    assert body.locator("strong").text_content() == "bold"  # Markdown still renders
    assert body.locator("pre code").text_content() == '<b onmouseover="window.__xss = 4">code</b>'
    links = body.locator("a")
    assert links.count() == 1 and links.get_attribute("href") == "https://example.com/"
    assert links.get_attribute("rel") == "noopener noreferrer"
    user = page.locator(".message.user .body").text_content()
    assert user == '<img src=y onerror="window.__xss = 5">'
    assert console.errors == []


MARKDOWN = """# Title
A *soft* and **strong** line with `code`,
a second line and a [link](https://example.com/a_b).

* * *

1. one
2. two

3. three after a blank line
- bullet snake_case __bold__
> quoted
```py
x = 1 < 2
```"""


def test_markdown_subset(page: Page, scripted: str) -> None:
    page.goto(scripted + "/")
    html = page.evaluate(
        """async (text) => {
            const { blocks } = await import("./ui/markdown.js");
            const div = document.createElement("div");
            div.append(...blocks(text));
            return div.innerHTML;
        }""",
        MARKDOWN,
    )
    assert html == (
        "<h3>Title</h3><p>A <em>soft</em> and <strong>strong</strong> line with <code>code</code>"
        ',<br>a second line and a <a href="https://example.com/a_b" target="_blank" '
        'rel="noopener noreferrer">link</a>.</p><hr><ol start="1"><li>one</li><li>two</li>'
        "<li>three after a blank line</li></ol><ul><li>bullet snake_case <strong>bold</strong>"
        "</li></ul><blockquote><p>quoted</p></blockquote><pre><code>x = 1 &lt; 2</code></pre>"
    )
