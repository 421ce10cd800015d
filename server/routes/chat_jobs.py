"""A validated chat request -> its prompt and engine jobs: the one path every conversation API shares.

``/v1/chat/completions`` validates its body as a ``ChatCompletionRequest`` and hands it here. The
OpenAI Responses API (``/v1/responses``) and the Anthropic Messages API (``/v1/messages``)
translate their bodies into the same ``ChatCompletionRequest`` (``to_chat_request``) and hand that
here too, so the chat template, tool prompts, the forced-call grammar, ``response_format``, the
context-length check and ``SamplingParams`` are decided in one place for all three: a fix to one
reaches the others.

The 400s raised here name the caller's own parameters (``ParamNames``): the Responses API's
``input`` and ``max_output_tokens`` rather than chat's ``messages`` and ``max_tokens``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from server.api.parsing import to_api_error
from server.generation.prompts import (
    later_system_messages_render,
    leading_system,
    render_chat,
    resolve_max_tokens,
)
from server.generation.submission import Job
from server.http.errors import APIError, invalid_request
from server.openai.schemas.chat import ChatCompletionRequest, template_messages
from server.routes.common import check_structured
from server.services.engine_host import EngineLike
from server.services.template_pool import budget_template_output
from server.settings import ServerSettings
from server.state import ServerState
from server.tools.tool_use import ToolUse


@dataclass(frozen=True)
class ParamNames:
    """What the caller's API calls chat's fields, for the errors raised here."""

    prompt: str = "messages"
    max_tokens: str | None = None  # None: the one the chat request used (max_tokens / max_completion_tokens)
    response_format: str = "response_format"
    # chat field -> the caller's, for a ``param`` that is the field or inside it (first match wins).
    # The whole param is replaced: chat's ``messages[3]`` need not be the caller's third item.
    renames: tuple[tuple[str, str], ...] = ()
    # the caller's max_tokens is a cap the context may lower (``resolve_max_tokens``' up_to_context)
    budget_up_to_context: bool = False

    def rename(self, param: str | None) -> str | None:
        if param is None:
            return None
        for chat, own in self.renames:
            if param == chat or param.startswith((chat + ".", chat + "[")):
                return own
        return param


@dataclass
class ChatJobs:
    """What a conversation request becomes: the rendered prompt, the engine jobs (one per choice)
    and the request's tool use (None when it offers no tools: no call parsing)."""

    prompt_ids: list[int]
    jobs: list[Job]
    tool_use: ToolUse | None


def to_chat_request(data: dict[str, Any], settings: ServerSettings, names: ParamNames) -> ChatCompletionRequest:
    """A translated body as the ``ChatCompletionRequest`` chat itself would have validated, under
    the server's limits. The translators check their own API's shapes first, so an error here is
    rare (a limit over the whole conversation, say); it is a 400 whose ``param`` is renamed to the
    caller's field."""
    try:
        return ChatCompletionRequest.model_validate(data, context={"settings": settings})
    except ValidationError as exc:
        err = to_api_error(exc.errors(include_url=False)[0])
        raise _renamed(err, names) from None


def _renamed(err: APIError, names: ParamNames) -> APIError:
    param = names.rename(err.param)
    message = err.message if err.param is None or param == err.param else err.message.replace(f"'{err.param}'", f"'{param}'")
    return APIError(err.status, message, type=err.type, param=param, code=err.code, headers=err.headers)


async def render_prompt(state: ServerState, engine: EngineLike, req: ChatCompletionRequest) -> tuple[list[int], ToolUse]:
    """The prompt's token ids (the chat template over the messages, with the tools it offers) and
    the request's ``ToolUse``. System messages after the first turn stay where they stand, or are
    joined into the leading one where the template takes no other. The template is code from a
    model file: it runs in the template pool, under its budget (``server.services.template_pool``)."""
    tokenizer = engine.tokenizer
    tool_use = ToolUse.from_request(req.tools or [], req.tool_choice, req.parallel_tool_calls, tokenizer)
    special = state.settings.allow_special_tokens_in_content
    prompt_ids = await state.template_pool.run(state.settings.chat_template_name, _render, tokenizer,
                                               template_messages(req.messages), tool_use, special)
    return prompt_ids, tool_use


def _render(tokenizer: Any, messages: list[dict[str, Any]], tool_use: ToolUse, special_tokens_in_content: bool) -> list[int]:
    budget_template_output(tokenizer)
    if not later_system_messages_render(tokenizer):
        messages = leading_system(messages)
    messages, template_kwargs = tool_use.prompt_messages(messages)
    return render_chat(tokenizer, messages, template_kwargs=template_kwargs, special_tokens_in_content=special_tokens_in_content)


async def chat_jobs(
    state: ServerState, engine: EngineLike, req: ChatCompletionRequest, names: ParamNames = ParamNames()
) -> ChatJobs:
    """The prompt, its completion budget, the constraint to decode under (``response_format``, or
    the call grammar when ``tool_choice`` forces a call) compiled once, and a job per choice."""
    prompt_ids, tool_use = await render_prompt(state, engine, req)
    tokens_param = names.max_tokens or req.budget_param
    budget = resolve_max_tokens(
        len(prompt_ids), req.completion_budget, engine.max_model_len, prompt_param=names.prompt, tokens_param=tokens_param,
        up_to_context=names.budget_up_to_context,
    )
    try:
        req.check_engine_limits(engine.vocab_size, budget)
    except APIError as err:
        raise _renamed(err, names) from None
    structured, param = req.structured_output, names.response_format
    if tool_use.forced:  # "required" or a named function: decode under the call grammar
        try:
            structured, param = tool_use.constraint(), "tool_choice"
        except ValueError as exc:
            raise invalid_request(f"'tool_choice' {exc}", "tool_choice", code="invalid_value") from None
    await check_structured(state, engine, structured, param)
    offered = tool_use if tool_use.offered else None
    jobs = [Job(i, prompt_ids, req.to_sampling_params(budget, i, structured), counts_prompt=i == 0,
                end_check=offered.end_check() if offered else None) for i in range(req.n)]
    return ChatJobs(prompt_ids, jobs, offered)
