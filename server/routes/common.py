"""Helpers every generation route needs: the validated body, the server state, the model check."""

from __future__ import annotations

import asyncio
from typing import TypeVar

import structlog
from starlette.requests import Request

from server.api.limits import LIMIT_EXCEEDED
from server.api.parsing import parse_body, show
from server.api.schema_base import Schema
from server.http.body import LARGE_BODY_BYTES, read_json_body, release_memory
from server.http.errors import APIError, invalid_request
from server.http.json_shape import json_shape
from server.http.request_log import request_id, request_log
from server.services.engine_host import EngineLike
from server.settings import ServerSettings
from server.state import ServerState
from specdec_core.decoding.structured_output import StructuredOutput

log = structlog.get_logger("specdec.server")

S = TypeVar("S", bound=Schema)
# Unknown field names come from the client: log a bounded number of bounded names.
MAX_LOGGED_FIELDS, MAX_FIELD_NAME = 20, 80


def server_state(request: Request) -> ServerState:
    return request.app.state.server


async def read_request(request: Request, schema: type[S]) -> S:
    """The body validated against ``schema`` under the server's limits (a 400 if it does not fit;
    415/413/408 from ``server.http.body`` before that). Fields the schema does not know are ignored, and
    named in a warning so a typo ("temprature") does not go unnoticed. Validation grows with the
    body, so it runs off the event loop."""
    settings = server_state(request).settings
    raw = await read_json_body(request, settings.max_body_bytes, settings.body_timeout)
    large = len(raw) >= LARGE_BODY_BYTES
    try:
        body, unknown = await asyncio.to_thread(_validate, schema, raw, settings)
    finally:
        if large:  # the parser's garbage is freed now: give it back (the body itself lives on)
            del raw
            await asyncio.to_thread(release_memory)
    if unknown:
        names = [name[:MAX_FIELD_NAME] for name in unknown[:MAX_LOGGED_FIELDS]]
        log.warning("ignoring unknown request fields", request_id=request_id(request), fields=names, count=len(unknown))
        request_log(request)["ignored_fields"] = names
    return body


def _validate(schema: type[S], raw: bytes, settings: ServerSettings) -> tuple[S, list[str]]:
    check_shape(raw, settings)
    body = parse_body(schema, raw, settings)
    return body, body.unknown_fields()


def check_shape(raw: bytes, settings: ServerSettings) -> None:
    """Refuse a body whose parse alone would hold the GIL too long (``server.http.json_shape``)."""
    shape = json_shape(raw)
    for count, limit, setting, noun in (
        (shape.containers, settings.max_body_containers, "max_body_containers", "JSON arrays, objects and object keys"),
        (shape.values, settings.max_body_values, "max_body_values", "JSON values"),
    ):
        if count > limit:
            flag, env = "--" + setting.replace("_", "-"), "SPECDEC_" + setting.upper()
            raise invalid_request(f"The request body has {count} {noun}; this server parses at most {limit} "
                                  f"(raise it with {flag} or {env}).", code=LIMIT_EXCEEDED)


def check_model(state: ServerState, model: str | None) -> str:
    """The served model name; 404 when the client asked for another model."""
    served = state.served_model_name
    if model is not None and model != served:
        # The name comes from the client and may be a megabyte long: shown cut, as JSON.
        raise APIError(404, f"The model {show(model, 120)} does not exist. This server serves '{served}'.",
                       param="model", code="model_not_found")
    return served


async def check_structured(state: ServerState, engine: EngineLike, spec: StructuredOutput | None, param: str) -> None:
    """Compile a structured-output spec once per request, off the event loop, on the server's
    grammar pool (``server.services.grammar_pool``; the engine caches the result for the request's
    choices); a spec the grammar engine cannot compile is a 400 that says why, a full pool a 503."""
    if spec is None:
        return
    try:
        await state.grammar_pool.run(engine.compile_structured, spec)
    except ValueError as exc:
        raise invalid_request(f"'{param}' {exc}", param, code="invalid_response_format") from None
