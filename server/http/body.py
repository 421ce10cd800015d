"""A request's JSON body, read within bounds: its media type, its size, and how long it may take.

The generation routes read their body here, once, before parsing it (``server.api.parsing``):

- **415** unless ``Content-Type`` is JSON (``application/json`` or ``application/<x>+json``). A web
  page may POST to any address without asking first only with ``text/plain``, form types or no
  type at all (a CORS "simple request"); anything else makes the browser ask the server first
  (preflight), which this server never approves. Requiring JSON therefore keeps other sites'
  pages from driving a local server. 415 rather than 400: it says exactly what is wrong (the body
  was never looked at), and the body is still an OpenAI error object.
- **413** when the declared ``Content-Length`` is over the limit (nothing is read), or when more
  bytes than the limit arrive (a chunked body declares no length).
- **408** when the whole body has not arrived within ``--body-timeout`` seconds of the headers: a
  client trickling a body would otherwise hold its request open for as long as it likes.

After a 413 or 408 the rest of the body is not read: the connection protocol
(``server.http.protocol``) closes a connection whose body is still arriving once it is answered.
A client that disconnects mid-body raises Starlette's ``ClientDisconnect``, which the request log
records as a disconnect (499), not as a server error.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import functools
from collections.abc import Callable

from starlette.requests import Request

from server.http.errors import APIError
from server.http.jsonio import ascii_int


def is_json(content_type: str | None) -> bool:
    """``application/json`` or ``application/<x>+json``, any parameters (JSON is UTF-8 by RFC 8259)."""
    if not content_type:
        return False
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def require_json(request: Request) -> None:
    content_type = request.headers.get("content-type")
    if is_json(content_type):
        return
    got = f"got {content_type[:100]!r}" if content_type else "the request has none"
    raise APIError(
        415,
        f"Content-Type must be application/json ({got}). With curl, add -H 'Content-Type: application/json'.",
        code="unsupported_media_type",
    )


def too_large(limit: int) -> APIError:
    return APIError(413, f"The request body is larger than {limit} bytes.", code="request_too_large")


async def read_json_body(request: Request, max_bytes: int, timeout_s: float) -> bytes:
    """The raw body of a JSON request, or the 415/413/408 ``APIError`` described above."""
    require_json(request)
    declared = request.headers.get("content-length")
    size = ascii_int(declared)
    if declared is not None and (size is None or size > max_bytes):  # "²", 5,000 digits: no sane length
        raise too_large(max_bytes)
    try:
        return await asyncio.wait_for(_read(request, max_bytes), timeout_s)
    except asyncio.TimeoutError:
        raise APIError(
            408, f"The request body did not arrive within {timeout_s:g} s.", code="request_timeout"
        ) from None


async def _read(request: Request, max_bytes: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise too_large(max_bytes)
        chunks.append(chunk)
    return b"".join(chunks)


# Bodies at least this large give their memory back to the OS once parsed (``release_memory``).
LARGE_BODY_BYTES = 1024 * 1024


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none (musl, macOS)."""
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None


def release_memory() -> None:
    """Hand freed heap memory back to the OS. After an 8 MB body is parsed, the allocator keeps the
    pages its many small objects used, and RSS stayed up for good (2.4 -> 4.4 GB after a flood of
    them). ``malloc_trim`` walks the heap without the GIL (ctypes releases it); call it off the loop."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
