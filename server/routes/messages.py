"""``POST /v1/messages`` (Anthropic's Messages API) and ``/v1/messages/count_tokens``, over chat's path.

The body is validated as Anthropic's (``server.anthropic.schemas``), translated into the
``ChatCompletionRequest`` chat validates (``server.anthropic.translate``) and handed to chat's own
``chat_jobs``; the engine output is rendered as an Anthropic ``message``
(``server.anthropic.render``), streamed or whole. Errors on these paths are in Anthropic's shape
(``server.http.errors``), and the API key may come as ``x-api-key`` (``server.http.auth``).
"""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import Response

from server.anthropic.render import MessageAnswer
from server.anthropic.schemas import MessagesPrompt, MessagesRequest
from server.anthropic.translate import chat_body, prompt_body
from server.generation.output_items import new_id
from server.generation.respond import respond_when_done, start_generation
from server.generation.streaming import Framing, GenerationStream
from server.http.jsonio import JSONResponse
from server.routes.chat_jobs import ParamNames, chat_jobs, render_prompt, to_chat_request
from server.routes.common import check_model, read_request, server_state

# What chat's fields are called here, for the errors the shared path raises. ``max_tokens`` is a cap
# the context lowers, as Anthropic's API does: Claude Code asks 32,000 of every request, which a
# 32k-context model with its ~12k-token prompt cannot give (a 400 on every request otherwise).
NAMES = ParamNames(prompt="messages", max_tokens="max_tokens", response_format="output_config.format",
                   renames=(("stop", "stop_sequences"), ("response_format", "output_config.format")),
                   budget_up_to_context=True)


async def create_message(request: Request) -> Response:
    arrival = time.perf_counter()
    state = server_state(request)
    req = await read_request(request, MessagesRequest)
    engine = state.require_engine()
    model = check_model(state, req.model)
    chat = to_chat_request(chat_body(req), state.settings, NAMES)
    prepared = await chat_jobs(state, engine, chat, NAMES)
    generation = start_generation(request, state, engine, prepared.jobs, endpoint="messages", id_prefix="msg",
                                  stream=req.stream, arrival=arrival)
    answer = MessageAnswer(new_id("msg"), model, generation, prepared.tool_use, req.stop_sequences, engine.tokenizer,
                           req.max_tokens)
    if req.stream:
        return GenerationStream(generation, answer.events(), Framing(done=None, error=answer.error))
    return await respond_when_done(generation, request, answer.body)


async def count_tokens(request: Request) -> Response:
    """``{"input_tokens": N}``: the prompt the same messages and tools would render to."""
    state = server_state(request)
    req = await read_request(request, MessagesPrompt)
    engine = state.require_engine()
    check_model(state, req.model)
    prompt_ids, _ = await render_prompt(state, engine, to_chat_request(prompt_body(req), state.settings, NAMES))
    return JSONResponse({"input_tokens": len(prompt_ids)})
