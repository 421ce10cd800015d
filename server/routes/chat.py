"""``POST /v1/chat/completions``: messages rendered with the model's chat template.

This module only turns the request into engine jobs (one per choice, ``server.routes.chat_jobs``,
the path the Responses and Messages APIs share) and says how a ``chat.completion`` looks
(``ChatRenderer``); ``server.openai.choices_response`` does the rest.
"""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import Response

from server.openai.bodies import TokenText
from server.openai.choices_response import generate
from server.openai.renderers import ChatRenderer
from server.openai.schemas.chat import ChatCompletionRequest
from server.routes.chat_jobs import chat_jobs
from server.routes.common import check_model, read_request, server_state


async def create_chat_completion(request: Request) -> Response:
    arrival = time.perf_counter()
    state = server_state(request)
    req = await read_request(request, ChatCompletionRequest)
    engine = state.require_engine()
    model = check_model(state, req.model)
    prepared = await chat_jobs(state, engine, req)
    renderer = ChatRenderer(TokenText(engine.tokenizer), req.num_logprobs is not None, prepared.tool_use,
                            prompt_logprobs=req.prompt_logprobs)
    return await generate(
        request, state, engine, prepared.jobs, renderer, endpoint="chat.completions", id_prefix="chatcmpl", model=model,
        stream=req.stream, include_usage=req.include_usage, arrival=arrival,
    )
