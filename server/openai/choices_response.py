"""The one response path of both generation endpoints: a ``Generation`` rendered as an SSE stream
or as one JSON body.

The data flows one way: HTTP body -> schema -> ``SamplingParams`` -> engine -> deltas -> renderer
-> response. Routes build the jobs and a ``server.openai.renderers`` renderer; everything after that
(request log fields, admission, the order of stream chunks, failures, usage and the
``speculative`` report, client disconnects) happens here, identically for completions and chat.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from server.api import response_types as rt
from server.generation.answer import answer_updates
from server.generation.respond import respond_when_done, start_generation
from server.generation.streaming import GenerationStream
from server.generation.submission import Generation, Job
from server.openai.bodies import envelope, system_fingerprint, usage
from server.openai.renderers import Renderer
from server.services.engine_host import EngineLike
from server.state import ServerState


@dataclass
class GenerationResponse:
    """One started generation and how to render it (see module docstring)."""

    generation: Generation
    renderer: Renderer
    model: str
    # OpenAI's stream_options.include_usage: a last chunk with usage, and the key on every chunk.
    include_usage: bool = False
    fingerprint: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def _envelope(
        self, choices: Sequence[rt.ResponseChoice], usage_: rt.Usage | None, speculative: rt.Speculative | None, *, chunk: bool
    ) -> rt.Envelope:
        obj = self.renderer.object_name(chunk=chunk)
        return envelope(obj, self.generation.request_id, self.created, self.model, list(choices), usage_, speculative,
                        self.fingerprint)

    def _chunk(
        self, choices: Sequence[rt.ResponseChoice], usage_: rt.Usage | None = None, speculative: rt.Speculative | None = None
    ) -> dict[str, Any]:
        body: dict[str, Any] = dict(self._envelope(choices, usage_, speculative, chunk=True))
        if not self.include_usage:
            del body["usage"]  # OpenAI sends the key only when stream_options.include_usage is set
        return body

    def _usage(self) -> rt.Usage:
        return usage(self.generation.prompt_tokens, self.generation.completion_tokens, self.generation.cached_tokens)

    async def chunks(self) -> AsyncIterator[dict[str, Any]]:
        """The stream's chunks: the renderer's opening, a chunk per piece of each update (a
        finished choice's last one with its finish reason), then the usage chunk if asked.
        ``speculative`` rides on the very last chunk. A failed or aborted choice ends the stream
        with an error event instead."""
        generation, renderer = self.generation, self.renderer
        for choices in renderer.opening(sorted(generation.choices)):
            yield self._chunk(choices)
        async for update in answer_updates(generation, renderer.tools):
            pieces = renderer.update(update)
            last = update.finished and generation.all_finished and not self.include_usage
            for i, piece in enumerate(pieces):
                final = last and i == len(pieces) - 1
                yield self._chunk([piece], speculative=generation.speculative() if final else None)
        failure = generation.failure()
        if failure is not None:
            yield failure.body()
            return
        if self.include_usage:
            yield self._chunk([], self._usage(), generation.speculative())

    def body(self) -> rt.Envelope:
        """The non-streamed body of a generation whose choices all finished."""
        done = [self.generation.choices[i] for i in sorted(self.generation.choices)]
        body = self._envelope([self.renderer.choice(c) for c in done], self._usage(), self.generation.speculative(),
                              chunk=False)
        body.update(self.renderer.body_fields(done))  # type: ignore[typeddict-item]
        return body

    async def respond(self, request: Request, *, stream: bool) -> Response:
        if stream:
            return GenerationStream(self.generation, self.chunks())
        return await respond_when_done(self.generation, request, self.body)


async def generate(
    request: Request,
    state: ServerState,
    engine: EngineLike,
    jobs: list[Job],
    renderer: Renderer,
    *,
    endpoint: str,
    id_prefix: str,
    model: str,
    stream: bool,
    include_usage: bool,
    arrival: float,
) -> Response:
    """Submit ``jobs`` (429/503/400 raised before any response starts) and answer with their
    output, streamed or whole. ``endpoint`` names the request in its log line."""
    generation = start_generation(request, state, engine, jobs, endpoint=endpoint, id_prefix=id_prefix, stream=stream,
                                  arrival=arrival)
    response = GenerationResponse(generation, renderer, model, include_usage, system_fingerprint(state.settings))
    return await response.respond(request, stream=stream)
