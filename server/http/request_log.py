"""One structured log line per HTTP request, written when its response (stream included) ends.

This middleware sits outside everything else so it also sees 401s and 429s. It gives every request
an id (``request.state.request_id``, echoed as ``X-Request-Id`` and used in completion ids), and
routes add their own fields (tokens, acceptance, time to first token) to ``request.state.log``.
Headers are never logged: they carry the API key. A client that leaves before it is answered
(mid-body included) is logged at info with status 499, nginx's code for it, never as a 500.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import structlog
from starlette.requests import ClientDisconnect, Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.prometheus import ServerMetrics

log = structlog.get_logger("specdec.request")

# Polled endpoints: logged at debug level, or a scrape every few seconds would drown the log.
QUIET_PATHS = frozenset({"/health", "/metrics"})
# Metric labels: known routes by name, anything else lumped together (bounded cardinality).
KNOWN_ROUTES = frozenset({"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics", "/openapi.json"})


def request_log(request: Request) -> dict[str, Any]:
    """The per-request log fields (see this module); a fresh dict outside the middleware."""
    state = request.scope.setdefault("state", {})
    return state.setdefault("log", {})


def request_id(request: Request) -> str:
    """The id the middleware gave this request; "unknown" outside it (an app built without it)."""
    return request.scope.get("state", {}).get("request_id") or "unknown"


def route_label(path: str) -> str:
    if path in KNOWN_ROUTES:
        return path
    if path.startswith("/v1/models/"):
        return "/v1/models/{model}"
    return "other"


class RequestLogMiddleware:
    def __init__(self, app: ASGIApp, metrics: ServerMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = uuid.uuid4().hex
        fields: dict[str, Any] = {}
        state = scope.setdefault("state", {})
        state["request_id"] = request_id
        state["log"] = fields
        started = time.perf_counter()
        status: int | None = None

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = list(message.get("headers", []))
                headers.append((b"x-request-id", request_id.encode()))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        except ClientDisconnect:
            # The client left mid-request (typically while sending its body): there is nobody to
            # answer and nothing failed here, so no 500 and no traceback; logged as a 499 below.
            fields["client_disconnected"] = True
        except BaseException:
            if status is None:
                status = 500
            raise
        finally:
            path = scope.get("path", "")
            # No response started at all: the client left before we answered (nginx's 499).
            final_status = status if status is not None else 499
            self.metrics.http_requests.labels(route=route_label(path), status=str(final_status)).inc()
            emit = log.debug if path in QUIET_PATHS else log.info
            emit(
                "request",
                request_id=request_id,
                method=scope.get("method"),
                path=path,
                status=final_status,
                total_s=round(time.perf_counter() - started, 4),
                **fields,
            )
