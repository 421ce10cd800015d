"""The HTTP/1.1 connection: uvicorn's h11 protocol, with the limits uvicorn lacks and OpenAI error
objects where uvicorn would answer in plain text.

What uvicorn (0.54) offers, and how it is used: ``timeout_keep_alive`` closes a kept-alive
connection that stays idle between requests (``--keep-alive-timeout``); ``limit_concurrency``
answers 503 once that many connections are open, but in plain text, so the same check is made here
instead (``--limit-concurrency``); ``h11_max_incomplete_event_size`` bounds a request's head
(16 KiB by default, kept). What it lacks: any timeout for *receiving* a request. A client that
connects and sends part of a request head, or nothing, holds its connection for as long as it
likes (issue 13 held 3,000 of them), and a body that trickles in after the app has answered is
read and discarded without limit. Its own answers (400 for malformed HTTP, the 503 above) are
plain text without ``x-request-id``.

This subclass adds:

- **head timeout** (``--header-timeout``): the request line and headers must be complete within
  that many seconds of the connection opening, or of the first byte of the next request on a
  kept-alive connection. Then: a 408 error object if part of a head arrived, a silent close if
  nothing did (an idle connection is not an HTTP request; the keep-alive timeout usually closes
  those first).
- **malformed HTTP** gets a 400 error object (code ``invalid_http``).
- **too many connections** (more than ``--limit-concurrency`` open): the request gets a 503 error
  object with ``Retry-After``, and its connection is closed.
- **a response finished while the client is still sending a body nobody reads** (an early 413,
  415, 408 or 404): the connection is closed instead of draining the rest without a time limit.
  Not at once: a socket closed while bytes still arrive makes the kernel answer them with a
  reset, which can destroy the response before the client has read it and fails the client's
  upload. So, as RFC 9112 section 9.6 describes, the write side is shut first (the client sees the
  whole answer, then end of stream) and what still arrives is discarded until the client stops
  sending for ``LINGER_IDLE_S`` or ``LINGER_MAX_S`` have passed (nginx's "lingering close").

- **request smuggling**: a request with both ``Transfer-Encoding`` and ``Content-Length`` gets a
  400 error object (code ``invalid_http``) and its connection is closed, as RFC 9112 section 6.3
  asks: h11 framed such a body by the chunked encoding and kept the connection, so a proxy that
  framed it by the length would let a second request ride inside the body.
- **probes are never refused for load**: ``/health`` and ``/metrics`` (``PROBE_PATHS``) pass the
  connection limit, so a flood of idle sockets cannot make Kubernetes restart the pod.
- **per-client connection cap** (``--max-connections-per-client``): a connection from an address
  that already holds that many is answered with a 503 error object and closed at once, so one
  client cannot fill ``--limit-concurrency`` on its own.

A body that arrives too slowly for the app is the app's concern (``server.http.body``: 408).
Answers written here carry an ``x-request-id`` of their own and are logged by ``specdec.request``
like any request; they never reach the app, so they are not in the HTTP metrics.
"""

from __future__ import annotations

import asyncio
import uuid
from http import HTTPStatus
from typing import Any

import h11
import structlog
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from server.http.errors import APIError
from server.http.host_check import PROBE_PATHS
from server.http.jsonio import dumps
from server.settings import ServerSettings

log = structlog.get_logger("specdec.request")

# Lingering close of a connection whose unread body is still arriving (see the module doc).
LINGER_IDLE_S = 2.0
LINGER_MAX_S = 30.0


class GuardedH11Protocol(H11Protocol):
    """See the module doc. Configured through class attributes (uvicorn builds one instance per
    connection from a class); ``protocol_for`` makes the configured subclass."""

    header_timeout_s: float = 10.0
    max_connections: int | None = None
    max_per_client: int | None = None
    # Open connections per client address, shared by every connection of one configured class.
    per_client: dict[str, int] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._linger_timer: asyncio.TimerHandle | None = None
        self._linger_until: float | None = None
        self._counted_as: str | None = None
        self.app = self._limited(self.app)

    # -- the head timeout and the per-client cap -----------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # type: ignore[override]
        super().connection_made(transport)  # type: ignore[arg-type]
        address = self.client[0] if self.client else None
        if address is not None and self.max_per_client is not None:
            if self.per_client.get(address, 0) >= self.max_per_client:
                # No log line: a flood would turn into one line per refused connection.
                self._refuse(503, f"This client already has {self.max_per_client} open connections "
                             "(see --max-connections-per-client).", "too_many_connections", logged=False)
                return
            self.per_client[address] = self.per_client.get(address, 0) + 1
            self._counted_as = address
        self._arm_head_timer()

    def data_received(self, data: bytes) -> None:
        if self._linger_until is not None:
            self._arm_linger_timer()  # discarded: nobody reads this body
            return
        super().data_received(data)
        if self.transport.is_closing():
            return
        if self.conn.their_state is h11.IDLE:
            self._arm_head_timer()  # the first bytes of a head on a kept-alive connection
        else:
            self._cancel_head_timer()  # a whole head arrived

    def on_response_complete(self) -> None:
        unread_body = self.conn.their_state is h11.SEND_BODY
        super().on_response_complete()
        if self.transport.is_closing():
            return
        if unread_body:
            self._linger()
        elif self.conn.their_state is h11.IDLE and self.conn.trailing_data[0]:
            self._arm_head_timer()  # part of a pipelined head was already buffered

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        if self._counted_as is not None:
            left = self.per_client.pop(self._counted_as, 1) - 1
            if left > 0:
                self.per_client[self._counted_as] = left
            self._counted_as = None
        if self._linger_timer is not None:
            self._linger_timer.cancel()
        super().connection_lost(exc)

    # -- closing a connection whose body is still arriving ------------------------------------
    def _linger(self) -> None:
        self._unset_keepalive_if_required()
        self._linger_until = self.loop.time() + LINGER_MAX_S
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self._arm_linger_timer()

    def _arm_linger_timer(self) -> None:
        assert self._linger_until is not None
        if self._linger_timer is not None:
            self._linger_timer.cancel()
        delay = min(LINGER_IDLE_S, self._linger_until - self.loop.time())
        self._linger_timer = self.loop.call_later(max(0.0, delay), self.transport.close)

    def _arm_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        if self.cycle is not None and not self.cycle.response_complete:
            return
        if not self.conn.trailing_data[0]:
            self.transport.close()
            return
        self._refuse(408, f"The request head did not arrive within {self.header_timeout_s:g} s.", "request_timeout")

    # -- uvicorn's own answers, as OpenAI error objects -----------------------------------------
    def send_400_response(self, msg: str) -> None:
        self._refuse(400, "The request is not valid HTTP/1.1.", "invalid_http")

    def _refuse(self, status: int, message: str, code: str, logged: bool = True) -> None:
        """Answer ``status`` with an error object and close, outside any request cycle."""
        request_id = uuid.uuid4().hex
        body = dumps(APIError(status, message, code=code).body())
        retry = "retry-after: 1\r\n" if status == 503 else ""
        head = (
            f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n{retry}x-request-id: {request_id}\r\n\r\n"
        )
        self.transport.write(head.encode("ascii") + body)
        self.transport.close()
        if logged:
            log.info("request", request_id=request_id, status=status, error=code, client=_client(self.client))

    # -- the connection limit -------------------------------------------------------------------
    def _limited(self, app: ASGIApp) -> ASGIApp:
        async def limited(scope: Scope, receive: Receive, send: Send) -> None:
            headers = {name for name, _ in scope.get("headers", [])}
            if b"transfer-encoding" in headers and b"content-length" in headers:
                await self._answer(scope, receive, send, 400, "A request must not carry both Transfer-Encoding "
                                   "and Content-Length (RFC 9112 section 6.3).", "invalid_http")
                return
            probe = scope.get("path", "").rstrip("/") in PROBE_PATHS
            if probe or self.max_connections is None or len(self.connections) <= self.max_connections:
                await app(scope, receive, send)
                return
            await self._answer(scope, receive, send, 503, f"The server has more than {self.max_connections} open "
                               "connections; retry shortly.", "too_many_connections")

        return limited

    async def _answer(self, scope: Scope, receive: Receive, send: Send, status: int, message: str, code: str) -> None:
        """An error object for a request the app never sees; the connection is closed after it."""
        request_id = uuid.uuid4().hex
        headers = {"Connection": "close", "x-request-id": request_id}
        if status == 503:
            headers["Retry-After"] = "1"
        log.warning("request", request_id=request_id, method=scope.get("method"), path=str(scope.get("path"))[:200],
                    status=status, error=code, open_connections=len(self.connections))
        await APIError(status, message, code=code, headers=headers).response()(scope, receive, send)


def _client(client: tuple[str, int] | None) -> str | None:
    return f"{client[0]}:{client[1]}" if client else None


def protocol_for(settings: ServerSettings) -> type[GuardedH11Protocol]:
    """The protocol class uvicorn should build connections from, configured by ``settings``."""
    return type(
        "SpecdecH11Protocol",
        (GuardedH11Protocol,),
        {"header_timeout_s": float(settings.header_timeout), "max_connections": settings.limit_concurrency,
         "max_per_client": settings.max_connections_per_client or None, "per_client": {}},
    )
