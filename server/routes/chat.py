"""``POST /v1/chat/completions``: messages rendered with the model's chat template."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from server.generation import Generation, Job
from server.prompts import render_chat, resolve_max_tokens
from server.responses import TokenText, chat_body, chat_choice, chat_chunk_choice, chat_logprobs, usage
from server.routes.common import check_model, read_request, request_id, request_log, respond_when_done, server_state
from server.schemas import ChatCompletionRequest
from server.streaming import GenerationStream


async def create_chat_completion(request: Request) -> Response:
    arrival = time.perf_counter()
    state = server_state(request)
    req = await read_request(request, ChatCompletionRequest)
    engine = state.require_engine()
    model = check_model(state, req.model)
    tokenizer = engine.tokenizer

    prompt_ids = render_chat(tokenizer, req.template_messages())
    budget = resolve_max_tokens(
        len(prompt_ids), req.completion_budget, engine.max_model_len, prompt_param="messages", tokens_param=req.budget_param
    )
    jobs = [Job(i, prompt_ids, req.to_sampling_params(budget, i), counts_prompt=i == 0) for i in range(req.n)]

    completion_id = f"chatcmpl-{request_id(request)}"
    fields = request_log(request)
    fields.update(endpoint="chat.completions", stream=req.stream)
    generation = Generation(state, engine, completion_id, jobs, arrival=arrival, log_fields=fields)
    generation.start()
    created = int(time.time())
    token_text = TokenText(tokenizer)

    if req.stream:
        chunks = _stream_chunks(generation, req, completion_id, created, model, token_text)
        return GenerationStream(generation, chunks)

    def body() -> dict[str, Any]:
        choices = []
        for index in sorted(generation.choices):
            choice = generation.choices[index]
            logprobs = chat_logprobs(token_text, choice.logprobs) if req.num_logprobs is not None else None
            choices.append(chat_choice(index, "".join(choice.text), choice.finish_reason, logprobs))
        return chat_body(
            completion_id,
            created,
            model,
            choices,
            usage(generation.prompt_tokens, generation.completion_tokens),
            generation.speculative(),
            chunk=False,
        )

    return await respond_when_done(generation, request, body)


async def _stream_chunks(
    generation: Generation,
    req: ChatCompletionRequest,
    completion_id: str,
    created: int,
    model: str,
    token_text: TokenText,
) -> AsyncIterator[dict[str, Any]]:
    """``chat.completion.chunk``s: a role delta first, content deltas, one finish chunk per choice."""

    def chunk(choices: list[dict], usage_: dict | None = None, speculative: dict | None = None) -> dict[str, Any]:
        body = chat_body(completion_id, created, model, choices, usage_, speculative, chunk=True)
        if not req.include_usage:
            del body["usage"]  # OpenAI sends the key only when stream_options.include_usage is set
        return body

    yield chunk([chat_chunk_choice(i, {"role": "assistant", "content": ""}) for i in sorted(generation.choices)])
    want_logprobs = req.num_logprobs is not None
    async for choice, out in generation.deltas():
        if out.finish_reason in ("error", "abort"):
            break
        logprobs = chat_logprobs(token_text, out.logprobs) if want_logprobs and out.logprobs else None
        if out.text or logprobs:
            yield chunk([chat_chunk_choice(choice.index, {"content": out.text}, None, logprobs)])
        if choice.finished:
            last = generation.all_finished and not req.include_usage
            yield chunk(
                [chat_chunk_choice(choice.index, {}, choice.finish_reason)],
                speculative=generation.speculative() if last else None,
            )

    failure = generation.failure()
    if failure is not None:
        yield failure.body()
        return
    if req.include_usage:
        yield chunk([], usage(generation.prompt_tokens, generation.completion_tokens), generation.speculative())
