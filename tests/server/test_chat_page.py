"""The chat page at ``/`` in a real browser: Debian's headless Chromium, driven by Playwright (the
``playwright`` Python package, launched on ``/usr/bin/chromium``: no browser download), against a
real ``specdec serve`` of the tiny draft pair with an API key (the shared ``keyed_server``).

Every wait is on the page's DOM (an answer's ``data-state``), never a sleep; the timeouts only bound
a run that something broke, so a slow machine passes too. ``SPECDEC_CHAT_SCREENSHOT=path`` also
saves the finished chat there (how ``docs/chat-page.png`` was made).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Page, sync_playwright

from tests.helpers.servers import KEYED_API_KEY as KEY
from tests.helpers.servers import ServerProcess

CHROMIUM = "/usr/bin/chromium"
# Generous: they bound a broken run; a working one ends as soon as the DOM says so.
WAIT_MS = 300_000
SOURCES = {"draft", "ngram", "target"}


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Page]:
    assert Path(CHROMIUM).exists(), "Debian's chromium is missing: apt-get install chromium"
    profile = tmp_path_factory.mktemp("chromium_profile")
    with sync_playwright() as p:
        # A fresh profile; no sandbox (CI runs as root); nothing that reaches for the network.
        context = p.chromium.launch_persistent_context(
            # bypass_csp: the page forbids eval, which the test driver's wait_for_function uses
            # (newer Playwright releases evaluate through it); users keep the page's policy.
            str(profile), executable_path=CHROMIUM, headless=True, viewport={"width": 1100, "height": 720},
            bypass_csp=True,
            args=["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--no-first-run", "--disable-sync"],
        )
        try:
            yield context.pages[0] if context.pages else context.new_page()
        finally:
            context.close()


def test_the_page_is_served_without_the_key_and_the_api_still_needs_it(keyed_server: ServerProcess) -> None:
    r = httpx.get(keyed_server.url + "/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "frame-ancestors 'none'" in r.headers["content-security-policy"]
    assert httpx.get(keyed_server.url + "/v1/models").status_code == 401
    # The Host allow-list guards the page like every other route but the probes.
    assert httpx.get(keyed_server.url + "/", headers={"Host": "evil.example"}).status_code == 400
    assert "/" in httpx.get(keyed_server.url + "/openapi.json").json()["paths"]


def ask(page: Page, text: str, turn: int) -> None:
    """Send ``text`` and wait until the ``turn``-th answer (0-based) finished or failed."""
    page.fill("#prompt", text)
    page.click("#send")
    page.locator(".assistant[data-state='done'], .assistant[data-state='error']").nth(turn).wait_for(timeout=WAIT_MS)
    answer = page.locator(".assistant").nth(turn)
    assert answer.get_attribute("data-state") == "done", answer.inner_text()


def test_a_chat_streams_coloured_tokens_with_speed_and_ttft(keyed_server: ServerProcess, page: Page) -> None:
    bodies: list[dict] = []
    page.on("request", lambda r: bodies.append(json.loads(r.post_data or "{}")) if r.url.endswith("/v1/chat/completions") else None)
    page.goto(keyed_server.url + "/")
    # Without the key the model list is refused, and the page says so.
    page.wait_for_function("document.getElementById('status').textContent.includes('API key')", timeout=WAIT_MS)
    page.fill("#api-key", KEY)
    page.dispatch_event("#api-key", "change")
    page.wait_for_function("document.getElementById('model').options.length > 0", timeout=WAIT_MS)
    page.select_option("#model", "tiny")
    page.fill("#max-tokens", "48")

    ask(page, "Tell me a story about a fox.", 0)
    answer = page.locator(".assistant").nth(0)
    spans = answer.locator(".text span")
    sources = spans.evaluate_all("spans => spans.map(s => s.dataset.source)")
    assert sources and set(sources) <= SOURCES, sources
    assert "draft" in sources, "no token of the answer came from the draft model"
    classes = set(spans.evaluate_all("spans => spans.map(s => s.className)"))
    assert "src-draft" in classes and classes <= {"src-draft", "src-lookup", "src-target"}
    assert "".join(spans.all_text_contents()) == answer.locator(".text").text_content()
    assert re.fullmatch(r"\d+(\.\d+)? tokens/s", answer.locator(".tps").inner_text())
    assert re.fullmatch(r"TTFT \d+ ms", answer.locator(".ttft").inner_text())
    assert re.fullmatch(r"\d+ tokens", answer.locator(".tokens").inner_text())

    ask(page, "And then?", 1)  # the conversation is kept: the second request carries the first answer
    assert [m["role"] for m in bodies[1]["messages"]] == ["user", "assistant", "user"]
    assert bodies[1]["messages"][1]["content"] == answer.locator(".text").text_content()
    assert all(b["specdec_provenance"] is True and b["model"] == "tiny" for b in bodies)

    shot = keyed_server.log_path.parent / "chat-page.png"
    page.screenshot(path=str(shot))
    assert shot.stat().st_size > 0
    if os.environ.get("SPECDEC_CHAT_SCREENSHOT"):
        shutil.copyfile(shot, os.environ["SPECDEC_CHAT_SCREENSHOT"])
