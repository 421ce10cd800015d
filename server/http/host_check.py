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

The probes (``PROBE_PATHS``: ``/health`` and ``/metrics``) are exempt: Kubernetes sends the
pod's IP as their Host, and they answer nothing a rebinding page could use.

**Absolute-form targets** (``GET http://host/v1/models``, RFC 9112 section 3.2.2: a server must
accept them) are served as their path; the Host checked is the target's authority.

**Trailing slash.** ``/v1/completions/`` is served as ``/v1/completions``. Starlette would
instead answer a 307 whose ``Location`` it builds from the request's Host header, i.e. a redirect
to wherever the client says the server is; the path is normalised in place, so the request log
and the metrics see the route's name.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from server.http.errors import APIError

PROBE_PATHS = frozenset({"/health", "/metrics"})
ABSOLUTE_FORM = ("http://", "https://")


def _name(authority: str) -> str:
    """A Host header's or target authority's name, lowercase, without port, brackets or userinfo."""
    text = authority.strip().lower().rsplit("@", 1)[-1]
    if text.startswith("["):  # [v6]:port
        return text[1:].split("]", 1)[0]
    return text.rsplit(":", 1)[0].rstrip(".") if text.count(":") == 1 else text.rstrip(".")


def host_name(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The Host header's name, lowercase, without port or brackets; ``None`` when there is none."""
    for name, value in headers:
        if name == b"host":
            return _name(value.decode("latin-1"))
    return None


def split_absolute_form(scope: Scope) -> str | None:
    """Turn an absolute-form target into its path in ``scope`` (in place); its host name, or None
    when the target was the usual origin form."""
    path = scope.get("path", "")
    if not path.lower().startswith(ABSOLUTE_FORM):
        return None
    authority, slash, rest = path.split("://", 1)[1].partition("/")
    scope["path"] = slash + rest or "/"
    raw = scope.get("raw_path")
    if isinstance(raw, bytes):
        _, raw_slash, raw_rest = raw.split(b"://", 1)[1].partition(b"/")
        scope["raw_path"] = raw_slash + raw_rest or b"/"
    return _name(authority)


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
        target_host = split_absolute_form(scope)
        if self.allowed_hosts is not None and scope.get("path", "").rstrip("/") not in PROBE_PATHS:
            host = target_host or host_name(scope.get("headers", []))
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
