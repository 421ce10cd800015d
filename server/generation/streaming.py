"""Server-sent events: OpenAI's ``data: {json}`` framing, ending with ``data: [DONE]``.

A stream that fails after it started cannot change its status any more, so a failure becomes an
``data: {"error": {...}}`` event followed by ``[DONE]`` (the openai SDK raises on it). A client
that disconnects makes sse-starlette cancel the body iterator; the ``finally`` below then ends the
generation, which aborts its engine requests and frees their cache.

The Responses and Anthropic Messages APIs frame their streams otherwise: every event is named
(``event: response.created``, ``event: message_start``; the anthropic SDK skips unnamed ones), no
``[DONE]`` ends them, and a failure is their own ``error`` event. Their iterators yield
``NamedEvent`` s and pass a ``Framing`` that says so; the lifecycle guarantees are the same.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import structlog
from sse_starlette import EventSourceResponse, ServerSentEvent

from server.generation.submission import Generation
from server.http.errors import APIError, internal_error
from server.http.jsonio import dumps_str

log = structlog.get_logger("specdec.server")

DONE = "[DONE]"
# Comment lines keep idle connections alive through proxies while a long prompt is prefilled.
PING_INTERVAL_S = 15


@dataclass(frozen=True)
class NamedEvent:
    """An SSE event with an ``event:`` name: ``event: <name>`` then ``data: <payload as JSON>``."""

    name: str
    payload: dict[str, Any]


Chunk = dict[str, Any] | NamedEvent


@dataclass(frozen=True)
class Framing:
    """How an API ends its stream: ``done`` is the last data line (None: nothing after the last
    event), ``error`` the event a failure that happens mid-stream becomes."""

    done: str | None = DONE
    error: Callable[[APIError], Chunk] = APIError.body


OPENAI_CHUNKS = Framing()


async def generation_events(
    generation: Generation, body: AsyncIterator[Chunk], framing: Framing = OPENAI_CHUNKS
) -> AsyncIterator[Chunk | str]:
    """Wrap an endpoint's chunk iterator: error event on failure, always ``[DONE]`` (where the API
    has one), always close."""
    try:
        try:
            async for chunk in body:
                yield chunk
        except Exception:
            log.exception("stream failed", request_id=generation.request_id)
            yield framing.error(internal_error(generation.request_id))
        if framing.done is not None:
            yield framing.done
    except asyncio.CancelledError:
        generation.disconnected = True
        raise
    finally:
        generation.close()


async def _frames(events: AsyncIterator[Chunk | str]) -> AsyncIterator[str | ServerSentEvent]:
    # Plain strings: sse-starlette frames them as `data: ...` with the response's separator.
    async for item in events:
        if isinstance(item, NamedEvent):
            yield ServerSentEvent(data=dumps_str(item.payload), event=item.name, sep="\n")
        else:
            yield item if isinstance(item, str) else dumps_str(item)


class GenerationStream(EventSourceResponse):
    """The SSE response of one generation; ends the generation however the response ends.

    ``generation_events`` closes the generation in its ``finally``, but only once it has started:
    a client that disconnects before the first chunk is pulled cancels the response before the
    body iterator ever runs. This wrapper is the guarantee that its engine requests are aborted.
    """

    def __init__(self, generation: Generation, chunks: AsyncIterator[Chunk], framing: Framing = OPENAI_CHUNKS) -> None:
        super().__init__(_frames(generation_events(generation, chunks, framing)), sep="\n", ping=PING_INTERVAL_S)
        self.generation = generation

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if not self.generation.closed and not self.generation.all_finished:
                self.generation.disconnected = True  # the body never ran to its end: client left
            self.generation.close()
