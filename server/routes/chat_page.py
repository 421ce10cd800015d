"""``GET /``: the chat page, a static HTML file shipped in this package (no build step).

It holds no data: every answer it shows comes from the ``/v1`` API, which the page calls like
any client (with the key the user types, when the server has ``--api-key``), so ``/`` itself needs
no key (``server.http.auth`` guards only ``/v1``). The Host allow-list still applies, like to every
route but the probes. The headers keep the page to its own inline code and this server: no other
origin's scripts, no framing by another site.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

PAGE = "chat_page.html"
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


@cache
def page_html() -> str:
    """The page, read once from the installed package (``pyproject.toml`` ships it as package data)."""
    return files("server.routes").joinpath(PAGE).read_text(encoding="utf-8")


async def chat_page(request: Request) -> Response:
    return HTMLResponse(page_html(), headers=HEADERS)
