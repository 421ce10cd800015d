"""``POST /v1/chat/completions``: messages rendered with the model's chat template.

This module only turns the request into engine jobs (one per choice) and says how a
``chat.completion`` looks (``ChatRenderer``); ``server.generation.response`` does the rest.
"""

from __future__ import annotations

import asyncio
import time

from starlette.requests import Request
from starlette.responses import Response

from server.generation.prompts import render_chat, resolve_max_tokens, template_messages
from server.generation.response import generate
from server.generation.submission import Job
from server.http.errors import invalid_request
from server.openai.bodies import TokenText
from server.openai.renderers import ChatRenderer
from server.openai.schemas.chat import ChatCompletionRequest
from server.routes.common import check_model, check_structured, read_request, server_state
from server.tools.tool_use import ToolUse


async def create_chat_completion(request: Request) -> Response:
    arrival = time.perf_counter()
    state = server_state(request)
    req = await read_request(request, ChatCompletionRequest)
    engine = state.require_engine()
    model = check_model(state, req.model)
    tokenizer = engine.tokenizer

    tool_use = ToolUse.from_request(req.tools or [], req.tool_choice, req.parallel_tool_calls, tokenizer)
    messages, template_kwargs = tool_use.prompt_messages(template_messages(req.messages))
    prompt_ids = await asyncio.to_thread(
        render_chat, tokenizer, messages, template_kwargs=template_kwargs,
        special_tokens_in_content=state.settings.allow_special_tokens_in_content,
    )
    budget = resolve_max_tokens(
        len(prompt_ids), req.completion_budget, engine.max_model_len, prompt_param="messages", tokens_param=req.budget_param
    )
    req.check_engine_limits(engine.vocab_size, budget)
    structured, param = req.structured_output, "response_format"
    if tool_use.forced:  # "required" or a named function: decode under the call grammar
        try:
            structured, param = tool_use.constraint(), "tool_choice"
        except ValueError as exc:
            raise invalid_request(f"'tool_choice' {exc}", "tool_choice", code="invalid_value") from None
    await check_structured(state, engine, structured, param)
    jobs = [Job(i, prompt_ids, req.to_sampling_params(budget, i, structured), counts_prompt=i == 0,
                end_check=tool_use.end_check() if tool_use.offered else None) for i in range(req.n)]

    renderer = ChatRenderer(TokenText(tokenizer), req.num_logprobs is not None, tool_use if tool_use.offered else None,
                            prompt_logprobs=req.prompt_logprobs)
    return await generate(
        request, state, engine, jobs, renderer, endpoint="chat.completions", id_prefix="chatcmpl", model=model,
        stream=req.stream, include_usage=req.include_usage, arrival=arrival,
    )
