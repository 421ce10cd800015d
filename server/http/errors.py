"""OpenAI error objects, and the exception handlers that turn every failure into one.

A client always gets ``{"error": {"message", "type", "param", "code"}}`` with a status that says
whose fault it was (4xx: the request, 5xx: the server). Stack traces go to the server log only.

The Anthropic Messages API (``/v1/messages`` and below) answers in Anthropic's shape instead,
``{"type": "error", "error": {"type", "message"}}`` with Anthropic's type for the status, since
that is what the anthropic SDK and Claude Code parse. One ``APIError`` serves both: the path the
error is answered on picks the shape (``APIError.response(path)``).
"""

from __future__ import annotations

from collections.abc import Mapping
from http import HTTPStatus

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from server.http.jsonio import JSONResponse

# The OpenAI `type` for each status we produce; clients (and the openai SDK) key on the status.
_DEFAULT_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable_error",
}


# Anthropic's error types by status (their API's list; other 4xx are invalid requests).
_ANTHROPIC_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
}


def speaks_anthropic(path: str) -> bool:
    """Whether ``path`` belongs to the Anthropic Messages API (whose errors have its own shape)."""
    return path == "/v1/messages" or path.startswith("/v1/messages/")


class APIError(Exception):
    """An error with an OpenAI-shaped body. Raise it anywhere in a request; a handler renders it."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str | None = None,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or _DEFAULT_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)

    def anthropic_body(self) -> dict:
        """Anthropic's shape: ``{"type": "error", "error": {"type", "message"}}``."""
        kind = _ANTHROPIC_TYPES.get(self.status, "api_error" if self.status >= 500 else "invalid_request_error")
        return {"type": "error", "error": {"type": kind, "message": self.message}}

    def response(self, path: str = "") -> Response:
        """The error as answered on ``path`` (Anthropic's shape under ``/v1/messages``). A 5xx
        closes its connection, and says so (``Connection: close``): after an unexpected error the
        connection's state is not trusted, and a client that kept it alive got a reset instead."""
        body = self.anthropic_body() if speaks_anthropic(path) else self.body()
        headers = {**self.headers, "Connection": "close"} if self.status >= 500 else self.headers
        return JSONResponse(body, status_code=self.status, headers=headers)


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def invalid_request(message: str, param: str | None = None, code: str = "invalid_value") -> APIError:
    """A 400: the client sent something we will not run. Never ``code: null``: clients branch on
    the code, and OpenAI's are specific (``invalid_value`` when nothing more precise applies)."""
    return APIError(400, message, param=param, code=code)


def unsupported(param: str, detail: str = "") -> APIError:
    """A 400 for an OpenAI field this server deliberately does not implement."""
    extra = f" {detail}" if detail else ""
    return APIError(400, f"'{param}' is not supported by this server.{extra}", param=param, code="unsupported_parameter")


def internal_error(request_id: str | None = None) -> APIError:
    """A 500 that says nothing about internals; the details are in the server log."""
    where = f" (request id {request_id})" if request_id else ""
    return APIError(500, f"The server failed to process this request{where}.", code="internal_error")


async def handle_api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, APIError)
    return exc.response(request.url.path)


async def handle_http_exception(request: Request, exc: Exception) -> Response:
    """Starlette's own errors (unknown route, wrong method, body too large) as OpenAI objects."""
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        message = f"Not found: {request.method} {request.url.path}"
    elif exc.status_code == 405:
        message = f"Method {request.method} is not allowed on {request.url.path}"
    else:
        message = exc.detail or HTTPStatus(exc.status_code).phrase
    headers = dict(exc.headers or {})
    err = APIError(exc.status_code, message, headers=headers)
    return err.response(request.url.path)


async def handle_unexpected(request: Request, exc: Exception) -> Response:
    """Last resort for a bug: a generic 500 (Starlette re-raises afterwards, which logs the trace).

    Starlette calls this from outside every middleware, so the request log's ``x-request-id`` is
    added here: the id is what ties the client's error to the trace in the log.
    """
    request_id = request.scope.get("state", {}).get("request_id")
    err = internal_error(request_id)
    if request_id:
        err.headers["x-request-id"] = request_id
    return err.response(request.url.path)
