"""Helpers every generation route needs: the JSON body, the server state, the model check."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from specdec_core.sampling_params import SamplingParams

from server.errors import APIError, invalid_request
from server.generation import Generation, run_until_disconnect
from server.jsonio import JSONResponse, loads
from server.protocol import SamplingOptions
from server.state import ServerState


def server_state(request: Request) -> ServerState:
    return request.app.state.server


def request_log(request: Request) -> dict[str, Any]:
    """The per-request log fields (see server.request_log); a fresh dict outside the middleware."""
    state = request.scope.setdefault("state", {})
    return state.setdefault("log", {})


def request_id(request: Request) -> str:
    return request.scope.get("state", {}).get("request_id") or "unknown"


async def read_json(request: Request) -> Any:
    raw = await request.body()
    if not raw.strip():
        raise invalid_request("The request body is empty; send a JSON object.")
    try:
        return loads(raw)
    except ValueError as exc:
        raise invalid_request(f"The request body is not valid JSON: {exc}") from None


def check_model(state: ServerState, model: str | None) -> str:
    """The served model name; 404 when the client asked for another model."""
    served = state.served_model_name
    if model is not None and model != served:
        raise APIError(404, f"The model '{model}' does not exist. This server serves '{served}'.", param="model", code="model_not_found")
    return served


def build_params(sampling: SamplingOptions, max_tokens: int, choice: int) -> SamplingParams:
    """Engine parameters for one choice. The HTTP layer validated every field already; should the
    engine's own checks still object, the message names the field and becomes a 400."""
    try:
        return sampling.params(max_tokens, choice)
    except ValueError as exc:
        message = str(exc)
        raise invalid_request(message, message.split(" ", 1)[0] or None) from None


async def respond_when_done(
    generation: Generation, request: Request, build_body: Callable[[], dict[str, Any]]
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
