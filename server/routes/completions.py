"""``POST /v1/completions``: text (or token-id) prompts, streamed or not.

This module only turns the request into engine jobs (one per prompt and choice) and says how a
``text_completion`` looks (``CompletionRenderer``); ``server.openai.choices_response`` does the rest.
"""

from __future__ import annotations

import asyncio
import time

from starlette.requests import Request
from starlette.responses import Response

from server.generation.prompts import resolve_max_tokens, tokenize_prompts
from server.generation.submission import Job
from server.openai.bodies import TokenText
from server.openai.choices_response import generate
from server.openai.renderers import CompletionRenderer
from server.openai.schemas.completions import CompletionRequest
from server.routes.common import check_model, check_structured, read_request, server_state


async def create_completion(request: Request) -> Response:
    arrival = time.perf_counter()
    state = server_state(request)
    req = await read_request(request, CompletionRequest)
    engine = state.require_engine()
    model = check_model(state, req.model)
    tokenizer = engine.tokenizer

    # Every prompt is checked before any budget, so which error a bad request gets stays stable.
    prompt_ids = await asyncio.to_thread(tokenize_prompts, tokenizer, req.prompt, engine.vocab_size)
    jobs: list[Job] = []
    echoes: dict[int, str] = {}
    structured = req.structured_output  # one spec for every choice: one cache key, one compile
    for p, (prompt, ids) in enumerate(zip(req.prompt, prompt_ids, strict=True)):
        budget = resolve_max_tokens(
            len(ids), req.max_tokens, engine.max_model_len, prompt_param="prompt", tokens_param="max_tokens"
        )
        req.check_engine_limits(engine.vocab_size, budget)
        for i in range(req.n):
            index = p * req.n + i
            jobs.append(Job(index, ids, req.to_sampling_params(budget, index, structured), counts_prompt=i == 0))
            if req.echo:
                echoes[index] = prompt if isinstance(prompt, str) else tokenizer.decode(ids)

    await check_structured(state, engine, structured, "response_format")
    renderer = CompletionRenderer(TokenText(tokenizer), req.num_logprobs is not None, echoes,
                                  echo_logprobs=req.logprobs if req.echo else None, prompt_logprobs=req.prompt_logprobs)
    return await generate(
        request, state, engine, jobs, renderer, endpoint="completions", id_prefix="cmpl", model=model,
        stream=req.stream, include_usage=req.include_usage, arrival=arrival,
    )
