"""``GET /health``: 200 while the engine loop runs; 503 while loading, draining, or after it died."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from server.http.jsonio import JSONResponse
from server.routes.common import server_state


async def health(request: Request) -> Response:
    ok, body = server_state(request).health()
    return JSONResponse(body, status_code=200 if ok else 503)
