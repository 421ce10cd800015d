"""``POST /v1/chat/completions``: messages rendered with the model's chat template.

This module only turns the request into engine jobs (one per choice) and says how a
``chat.completion`` looks (``ChatRenderer``); ``server.generation.response`` does the rest.
"""

from __future__ import annotations

import asyncio
import time

from starlette.requests import Request
from starlette.responses import Response

from server.generation.submission import Job
from server.generation.response import generate
from server.generation.prompts import render_chat, resolve_max_tokens
from server.openai.renderers import ChatRenderer
from server.openai.bodies import TokenText
from server.routes.common import check_model, check_structured, read_request, server_state
from server.openai.schemas import ChatCompletionRequest
from server.tools.parser import forced_calls


async def create_chat_completion(request: Request) -> Response:
    arrival = time.perf_counter()
    state = server_state(request)
    req = await read_request(request, ChatCompletionRequest)
    engine = state.require_engine()
    model = check_model(state, req.model)
    tokenizer = engine.tokenizer

    tools = req.offered_tools
    prompt_ids = await asyncio.to_thread(
        render_chat, tokenizer, req.template_messages(), tools=tools,
        special_tokens_in_content=state.settings.allow_special_tokens_in_content,
    )
    budget = resolve_max_tokens(
        len(prompt_ids), req.completion_budget, engine.max_model_len, prompt_param="messages", tokens_param=req.budget_param
    )
    req.check_engine_limits(engine.vocab_size, budget)
    structured, param = req.structured_output, "response_format"
    if req.forced_tools:  # "required" or a named function: decode under the call grammar
        structured, param = forced_calls(tools, req.forced_tools, req.parallel_calls_allowed, tokenizer), "tool_choice"
    await check_structured(engine, structured, param)
    jobs = [Job(i, prompt_ids, req.to_sampling_params(budget, i, structured), counts_prompt=i == 0) for i in range(req.n)]

    renderer = ChatRenderer(TokenText(tokenizer), req.num_logprobs is not None, {t["name"] for t in tools}, req.max_tool_calls)
    return await generate(
        request, state, engine, jobs, renderer, endpoint="chat.completions", id_prefix="chatcmpl", model=model,
        stream=req.stream, include_usage=req.include_usage, arrival=arrival,
    )
