"""``POST /v1/completions``: text (or token-id) prompts, streamed or not."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from server.generation import Generation, Job
from server.prompts import resolve_max_tokens, tokenize_prompt
from server.responses import CompletionLogprobs, TokenText, completion_body, completion_choice, usage
from server.routes.common import check_model, read_request, request_id, request_log, respond_when_done, server_state
from server.schemas import CompletionRequest
from server.streaming import GenerationStream


async def create_completion(request: Request) -> Response:
    arrival = time.perf_counter()
    state = server_state(request)
    req = await read_request(request, CompletionRequest)
    engine = state.require_engine()
    model = check_model(state, req.model)
    tokenizer = engine.tokenizer

    prompt_ids = [tokenize_prompt(tokenizer, p, engine.vocab_size) for p in req.prompt]
    jobs: list[Job] = []
    echoes: dict[int, str] = {}
    for p, ids in enumerate(prompt_ids):
        budget = resolve_max_tokens(
            len(ids), req.max_tokens, engine.max_model_len, prompt_param="prompt", tokens_param="max_tokens"
        )
        prompt = req.prompt[p]
        for i in range(req.n):
            index = p * req.n + i
            jobs.append(Job(index, ids, req.to_sampling_params(budget, index), counts_prompt=i == 0))
            if req.echo:
                echoes[index] = prompt if isinstance(prompt, str) else tokenizer.decode(ids)

    completion_id = f"cmpl-{request_id(request)}"
    fields = request_log(request)
    fields.update(endpoint="completions", stream=req.stream)
    generation = Generation(state, engine, completion_id, jobs, arrival=arrival, log_fields=fields)
    generation.start()
    created = int(time.time())
    token_text = TokenText(tokenizer)

    if req.stream:
        chunks = _stream_chunks(generation, req, completion_id, created, model, echoes, token_text)
        return GenerationStream(generation, chunks)

    def body() -> dict[str, Any]:
        choices = []
        for index in sorted(generation.choices):
            choice = generation.choices[index]
            prefix = echoes.get(index, "")
            logprobs = None
            if req.num_logprobs is not None:
                logprobs = CompletionLogprobs(token_text, len(prefix)).piece(choice.logprobs)
            choices.append(completion_choice(index, prefix + "".join(choice.text), choice.finish_reason, logprobs))
        return completion_body(
            completion_id,
            created,
            model,
            choices,
            usage(generation.prompt_tokens, generation.completion_tokens),
            generation.speculative(),
        )

    return await respond_when_done(generation, request, body)


async def _stream_chunks(
    generation: Generation,
    req: CompletionRequest,
    completion_id: str,
    created: int,
    model: str,
    echoes: dict[int, str],
    token_text: TokenText,
) -> AsyncIterator[dict[str, Any]]:
    """``text_completion`` chunks; the last one carries ``speculative`` (and usage if asked)."""

    def chunk(choices: list[dict], usage_: dict | None = None, speculative: dict | None = None) -> dict[str, Any]:
        body = completion_body(completion_id, created, model, choices, usage_, speculative)
        if not req.include_usage:
            del body["usage"]  # OpenAI sends the key only when stream_options.include_usage is set
        return body

    builders: dict[int, CompletionLogprobs] = {}
    if req.num_logprobs is not None:
        builders = {index: CompletionLogprobs(token_text, len(echoes.get(index, ""))) for index in generation.choices}
    for index, prefix in sorted(echoes.items()):
        yield chunk([completion_choice(index, prefix, None, None)])

    async for choice, out in generation.deltas():
        if out.finish_reason in ("error", "abort"):
            break
        logprobs = builders[choice.index].piece(out.logprobs) if builders and out.logprobs else None
        if out.text or logprobs:
            yield chunk([completion_choice(choice.index, out.text, None, logprobs)])
        if choice.finished:
            last = generation.all_finished and not req.include_usage
            yield chunk(
                [completion_choice(choice.index, "", choice.finish_reason, None)],
                speculative=generation.speculative() if last else None,
            )

    failure = generation.failure()
    if failure is not None:
        yield failure.body()
        return
    if req.include_usage:
        yield chunk([], usage(generation.prompt_tokens, generation.completion_tokens), generation.speculative())
