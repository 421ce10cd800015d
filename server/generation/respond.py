"""A generation for one HTTP request: started and logged, and answered whole (a stream is
``server.generation.streaming.GenerationStream``). Every API answers through these two, so
admission, the request log's fields, client disconnects and failures behave alike in all of them;
each API only builds its body (``build_body``) or its events."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from server.generation.submission import Generation, Job, run_until_disconnect
from server.http.jsonio import JSONResponse
from server.http.request_log import request_id, request_log
from server.services.engine_host import EngineLike
from server.state import ServerState


def start_generation(
    request: Request, state: ServerState, engine: EngineLike, jobs: list[Job], *, endpoint: str, id_prefix: str,
    stream: bool, arrival: float,
) -> Generation:
    """Submit ``jobs`` as one logged generation (429/503/400 raised before any response starts);
    ``endpoint`` names the request in its log line."""
    fields = request_log(request)
    fields.update(endpoint=endpoint, stream=stream)
    generation = Generation(state, engine, f"{id_prefix}-{request_id(request)}", jobs, arrival=arrival, log_fields=fields)
    generation.start()
    return generation


async def respond_when_done(
    generation: Generation, request: Request, build_body: Callable[[], Mapping[str, Any]]
) -> Response:
    """The non-streamed answer: wait for every choice (closing the generation either way), then the
    JSON body from ``build_body``. A client that went away gets 499; an engine failure is raised."""
    try:
        connected = await run_until_disconnect(generation, request.receive)
    finally:
        generation.close()
    if not connected:
        return Response(status_code=499)
    failure = generation.failure()
    if failure is not None:
        raise failure
    return JSONResponse(build_body())
