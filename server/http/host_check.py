"""Where a request is addressed: the Host it names must be one this server answers to, and a
trailing slash in its path is ignored.

**Host allow-list** (``--allowed-hosts``). A page on another site can make a browser send
requests to ``127.0.0.1`` by rebinding its own DNS name to that address; the browser then treats
the server as the page's own origin and lets the page read the answers. The one thing such a
request cannot hide is the name it was sent to: its ``Host`` header still says the attacker's
name. So a request whose Host is not on the list gets a 400 before anything else runs. The
default list (see ``ServerSettings.host_allowlist``) is the loopback names when the server
listens on a loopback address, and any name otherwise. A request without a Host header (HTTP/1.0)
is let through: browsers always send one.

**Trailing slash.** ``/v1/completions/`` is served as ``/v1/completions``. Starlette would
instead answer a 307 whose ``Location`` it builds from the request's Host header, i.e. a redirect
to wherever the client says the server is; the path is normalised in place, so the request log
and the metrics see the route's name.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from server.http.errors import APIError


def host_name(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The Host header's name, lowercase, without port or brackets; ``None`` when there is none."""
    for name, value in headers:
        if name == b"host":
            text = value.decode("latin-1").strip().lower()
            if text.startswith("["):  # [v6]:port
                return text[1:].split("]", 1)[0]
            return text.rsplit(":", 1)[0].rstrip(".") if text.count(":") == 1 else text.rstrip(".")
    return None


def host_allowed(host: str, allowed: frozenset[str]) -> bool:
    """``host`` is on the list, or under a ``*.domain`` entry of it."""
    if host in allowed:
        return True
    return any(entry.startswith("*.") and host.endswith(entry[1:]) for entry in allowed)


class RequestTargetMiddleware:
    def __init__(self, app: ASGIApp, allowed_hosts: frozenset[str] | None) -> None:
        self.app = app
        self.allowed_hosts = allowed_hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.allowed_hosts is not None:
            host = host_name(scope.get("headers", []))
            if host is not None and not host_allowed(host, self.allowed_hosts):
                err = APIError(
                    400,
                    f"This server does not answer to the host name {host[:100]!r} (see --allowed-hosts).",
                    code="invalid_host",
                )
                await err.response()(scope, receive, send)
                return
        path = scope.get("path", "")
        if len(path) > 1 and path.endswith("/"):
            scope["path"] = path.rstrip("/") or "/"
            raw = scope.get("raw_path")
            if isinstance(raw, bytes):
                scope["raw_path"] = raw.rstrip(b"/") or b"/"
        await self.app(scope, receive, send)
