"""Server-sent events: OpenAI's ``data: {json}`` framing, ending with ``data: [DONE]``.

A stream that fails after it started cannot change its status any more, so a failure becomes an
``data: {"error": {...}}`` event followed by ``[DONE]`` (the openai SDK raises on it). A client
that disconnects makes sse-starlette cancel the body iterator; the ``finally`` below then ends the
generation, which aborts its engine requests and frees their cache.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import structlog
from sse_starlette import EventSourceResponse

from server.generation.submission import Generation
from server.http.errors import internal_error
from server.http.jsonio import dumps_str

log = structlog.get_logger("specdec.server")

DONE = "[DONE]"
# Comment lines keep idle connections alive through proxies while a long prompt is prefilled.
PING_INTERVAL_S = 15


async def generation_events(generation: Generation, body: AsyncIterator[dict[str, Any]]) -> AsyncIterator[dict | str]:
    """Wrap an endpoint's chunk iterator: error event on failure, always ``[DONE]``, always close."""
    try:
        try:
            async for chunk in body:
                yield chunk
        except Exception:
            log.exception("stream failed", request_id=generation.request_id)
            yield internal_error(generation.request_id).body()
        yield DONE
    except asyncio.CancelledError:
        generation.disconnected = True
        raise
    finally:
        generation.close()


async def _frames(events: AsyncIterator[dict | str]) -> AsyncIterator[str]:
    # Plain strings: sse-starlette frames them as `data: ...` with the response's separator.
    async for item in events:
        yield item if isinstance(item, str) else dumps_str(item)


class GenerationStream(EventSourceResponse):
    """The SSE response of one generation; ends the generation however the response ends.

    ``generation_events`` closes the generation in its ``finally``, but only once it has started:
    a client that disconnects before the first chunk is pulled cancels the response before the
    body iterator ever runs. This wrapper is the guarantee that its engine requests are aborted.
    """

    def __init__(self, generation: Generation, chunks: AsyncIterator[dict[str, Any]]) -> None:
        super().__init__(_frames(generation_events(generation, chunks)), sep="\n", ping=PING_INTERVAL_S)
        self.generation = generation

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if not self.generation.closed and not self.generation.all_finished:
                self.generation.disconnected = True  # the body never ran to its end: client left
            self.generation.close()
