"""``/v1/responses``: OpenAI's Responses API over chat's path, and its stored responses.

``POST`` validates the Responses body (``server.openai.schemas.responses``), puts the stored
conversation of ``previous_response_id`` in front of its input, translates it into the
``ChatCompletionRequest`` chat validates (``server.openai.responses_input``) and hands that to
chat's own ``chat_jobs``; the engine output is rendered as a ``response`` (``server.openai.
responses_render``), streamed or whole. With ``store`` (OpenAI's default) the finished response is
kept in the server's bounded ``ResponseStore``, which ``GET``/``DELETE /v1/responses/{id}`` and
``GET /v1/responses/{id}/input_items`` read. An unknown, evicted or expired id is a 404.
``POST /v1/responses/input_tokens`` counts the prompt a body renders to; ``POST
/v1/responses/compact`` is a 404 that says compaction is not served (docs/api.md).
"""

from __future__ import annotations

import time
from typing import Any

import structlog
from starlette.requests import Request
from starlette.responses import Response

from server.generation.output_items import OutputItem, new_id
from server.generation.respond import respond_when_done, start_generation
from server.generation.streaming import Framing, GenerationStream
from server.http.errors import APIError, invalid_request
from server.http.jsonio import JSONResponse, ascii_int
from server.http.request_log import request_id
from server.openai.responses_input import chat_body, chat_messages, conversation_of, listed_items
from server.openai.responses_render import ResponseAnswer, conversation_items, head
from server.openai.responses_tools import ResponsesTools
from server.openai.schemas.chat import ChatCompletionRequest
from server.openai.schemas.responses import ResponsesRequest
from server.routes.chat_jobs import ParamNames, chat_jobs, render_prompt, to_chat_request
from server.routes.common import check_model, read_request, server_state
from server.services.response_store import StoredResponse
from server.state import ServerState

# What chat's fields are called here, for the errors the shared path raises.
NAMES = ParamNames(
    prompt="input", max_tokens="max_output_tokens", response_format="text.format",
    renames=(("messages", "input"), ("max_tokens", "max_output_tokens"), ("response_format", "text.format")),
)
MAX_LIST_LIMIT = 100
log = structlog.get_logger("specdec.server")


def not_found(response_id: str, param: str | None = None) -> APIError:
    shown = response_id if len(response_id) <= 80 else response_id[:77] + "..."
    where = f"'{param}': n" if param else "N"
    return APIError(404, f"{where}o response with id '{shown}' is stored here (never stored, deleted, evicted or expired).",
                    param=param, code="response_not_found")


def stored(state: ServerState, response_id: str, param: str | None = None) -> StoredResponse:
    entry = state.responses.get(response_id)
    if entry is None:
        raise not_found(response_id, param)
    return entry


Conversation = list[dict[str, Any]]


def conversation_request(
    state: ServerState, request: Request, req: ResponsesRequest
) -> tuple[ResponsesTools, Conversation, ChatCompletionRequest]:
    """The request's tools, its conversation (the stored one of ``previous_response_id`` first)
    and the chat request they make."""
    history = stored(state, req.previous_response_id, "previous_response_id").conversation if req.previous_response_id else []
    conversation = history + chat_messages(conversation_of(req.input))
    if not conversation:
        raise invalid_request("'input' must not be empty.", "input", code="empty_array")
    tools = ResponsesTools.of(req.tools)
    if tools.left_out:
        log.warning("leaving out tools this server cannot run", request_id=request_id(request), types=tools.left_out)
    instructions = [{"role": "system", "content": req.instructions}] if req.instructions else []
    return tools, conversation, to_chat_request(chat_body(req, tools, instructions + conversation), state.settings, NAMES)


async def create_response(request: Request) -> Response:
    arrival = time.perf_counter()
    state = server_state(request)
    req = await read_request(request, ResponsesRequest)
    engine = state.require_engine()
    model = check_model(state, req.model)
    tools, conversation, chat = conversation_request(state, request, req)
    prepared = await chat_jobs(state, engine, chat, NAMES)

    response_id = new_id("resp")
    input_items = listed_items(req.input)

    def keep(body: dict[str, Any], items: list[OutputItem]) -> None:
        if req.store:
            state.responses.put(response_id, body, conversation + chat_messages(conversation_items(items)), input_items)

    generation = start_generation(request, state, engine, prepared.jobs, endpoint="responses", id_prefix="resp",
                                  stream=req.stream, arrival=arrival)
    answer = ResponseAnswer(head(response_id, model, req), generation, prepared.tool_use, tools, keep)
    if req.stream:
        return GenerationStream(generation, answer.events(), Framing(done=None, error=answer.error))
    return await respond_when_done(generation, request, answer.body)


async def count_input_tokens(request: Request) -> Response:
    """``POST /v1/responses/input_tokens``: the prompt tokens the same body would have."""
    state = server_state(request)
    req = await read_request(request, ResponsesRequest)
    engine = state.require_engine()
    check_model(state, req.model)
    _, _, chat = conversation_request(state, request, req)
    prompt_ids, _ = await render_prompt(state, engine, chat)
    return JSONResponse({"object": "response.input_tokens", "input_tokens": len(prompt_ids)})


async def compact_response(request: Request) -> Response:
    """``POST /v1/responses/compact`` is not served: a 404 that says so (docs/api.md)."""
    raise APIError(404, "This server does not compact conversations (/v1/responses/compact): a client that needs a "
                   "shorter history summarizes it with a normal response, as Codex CLI does with any provider but "
                   "OpenAI's.", code="not_supported")


async def retrieve_response(request: Request) -> Response:
    if request.query_params.get("stream") in ("true", "1"):
        raise APIError(400, "Replaying a stored response as a stream is not supported; retrieve it without 'stream'.",
                       param="stream", code="unsupported_parameter")
    return JSONResponse(stored(server_state(request), request.path_params["response_id"]).response)


async def delete_response(request: Request) -> Response:
    response_id = request.path_params["response_id"]
    if not server_state(request).responses.delete(response_id):
        raise not_found(response_id)
    return JSONResponse({"id": response_id, "object": "response", "deleted": True})


async def list_input_items(request: Request) -> Response:
    """OpenAI's list: ``order`` (``desc``, the default, or ``asc``), ``limit`` (1..100, 20), ``after``."""
    entry = stored(server_state(request), request.path_params["response_id"])
    query = request.query_params
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise invalid_request(f"'order' must be 'asc' or 'desc', got {order[:20]!r}.", "order")
    limit = ascii_int(query.get("limit", "20"), max_digits=3)
    if limit is None or not 1 <= limit <= MAX_LIST_LIMIT:
        raise invalid_request(f"'limit' must be an integer from 1 to {MAX_LIST_LIMIT}.", "limit")
    items = entry.input_items if order == "asc" else entry.input_items[::-1]
    after = query.get("after")
    if after is not None:
        ids = [item["id"] for item in items]
        if after not in ids:
            raise invalid_request("'after' names no item of this response.", "after")
        items = items[ids.index(after) + 1:]
    page = items[:limit]
    return JSONResponse({"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                         "last_id": page[-1]["id"] if page else None, "has_more": len(items) > len(page)})
