"""``--api-key``: every ``/v1`` route requires ``Authorization: Bearer KEY`` (or ``x-api-key: KEY``).

``/health`` and ``/metrics`` stay open (orchestrators and scrapers). The comparison is constant
time (``hmac.compare_digest``) so response timing does not leak how much of a guess was right.
``x-api-key`` is how the anthropic SDK and Claude Code send a key; it is accepted on every route,
as is the bearer token on the Messages API (the anthropic SDK's ``auth_token`` sends one).
"""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from server.http.errors import APIError


def requires_key(path: str) -> bool:
    return path == "/v1" or path.startswith("/v1/")


def bearer_token(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    for name, value in headers:
        if name.lower() == b"authorization":
            scheme, _, token = value.strip().partition(b" ")
            if scheme.lower() == b"bearer" and token.strip():
                return token.strip()
            return None
    return None


def x_api_key(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    for name, value in headers:
        if name.lower() == b"x-api-key":
            return value.strip() or None
    return None


class APIKeyMiddleware:
    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self._key = api_key.encode()

    def authorized(self, scope: Scope) -> bool:
        headers = scope.get("headers", [])
        # compare_digest on bytes of different lengths still takes time independent of content.
        return any(token is not None and hmac.compare_digest(token, self._key)
                   for token in (bearer_token(headers), x_api_key(headers)))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and requires_key(path) and not self.authorized(scope):
            err = APIError(
                401,
                "Missing or invalid API key. Send it as 'Authorization: Bearer <key>' or 'x-api-key: <key>'.",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )
            await err.response(path)(scope, receive, send)
            return
        await self.app(scope, receive, send)
