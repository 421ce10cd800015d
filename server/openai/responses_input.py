"""A Responses API body -> the chat request it means (the internal form chat itself validates).

The Responses API describes a conversation as items: messages, the model's ``function_call`` s and
the client's ``function_call_output`` s. Chat describes the same thing as messages: an assistant
message with ``tool_calls``, ``tool`` messages answering them. ``chat_messages`` maps one onto the
other (consecutive calls after an assistant's text join that message, as chat would have returned
them), ``chat_body`` carries the sampling fields over, and from there the request is chat's. An
answer's output items are input items too, so the stored conversation of a response is its input
and output mapped by the same function: a continued turn renders exactly the prompt a client
resending the whole conversation to chat would get, which the prefix cache then mostly serves.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from server.generation.output_items import new_id
from server.openai.responses_tools import ResponsesTools, custom_arguments, joined_name
from server.openai.schemas.responses import InputItem, ResponsesRequest


@dataclass(frozen=True)
class ConversationItem:
    """An item as far as the conversation is concerned: an input item, or an answer's output item."""

    type: str  # message | function_call | function_call_output
    role: str | None = None
    text: str = ""  # a message's text, or a call's output
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None

    @classmethod
    def of(cls, item: InputItem) -> ConversationItem | None:
        """The item in chat's terms: a custom tool's call is a call of the function it is offered
        as, a namespaced tool's call names the joined function (``server.openai.responses_tools``);
        None for a reasoning item (not part of the prompt)."""
        if item.type == "reasoning":
            return None
        if item.type in ("function_call", "custom_tool_call"):
            arguments = item.arguments if item.type == "function_call" else custom_arguments(item.input or "")
            return cls("function_call", call_id=item.call_id, name=joined_name(item.namespace, item.name or ""),
                       arguments=arguments)
        kind = "message" if item.type == "message" else "function_call_output"
        return cls(kind, item.role, item.text, item.call_id)


def conversation_of(items: Iterable[InputItem]) -> list[ConversationItem]:
    return [c for c in map(ConversationItem.of, items) if c is not None]


def chat_messages(items: Iterable[ConversationItem]) -> list[dict[str, Any]]:
    """Items as chat messages, in order (see module docstring)."""
    out: list[dict[str, Any]] = []
    for item in items:
        if item.type == "message":
            out.append({"role": item.role, "content": item.text})
        elif item.type == "function_call":
            call = {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        else:
            out.append({"role": "tool", "tool_call_id": item.call_id, "content": item.text})
    return out


def chat_body(req: ResponsesRequest, tools: ResponsesTools, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The chat request for ``messages`` with this body's sampling, tools and format. ``tool_choice``
    "auto"/"none" and ``parallel_tool_calls`` without tools are dropped (they mean nothing then;
    chat refuses them), a forcing one is left for chat to refuse. ``text.format`` shapes the
    answer's text; an answer forced to be a call has none, so a forcing ``tool_choice`` decodes
    under the call grammar alone (the Agents SDK sends both when an agent has an output type;
    chat, whose ``response_format`` is the whole answer, refuses the pair)."""
    forcing = tools.served and (req.tool_choice == "required" or isinstance(req.tool_choice, dict))
    body: dict[str, Any] = {
        "model": req.model, "messages": messages, "max_tokens": req.max_output_tokens,
        "temperature": req.temperature, "top_p": req.top_p, "user": req.user, "seed": req.seed, "top_k": req.top_k,
        "speculative": req.speculative, "num_speculative_tokens": req.num_speculative_tokens, "cache_salt": req.cache_salt,
        "response_format": {"type": "text"} if forcing else _response_format(req),
    }
    if tools.served:
        body["tools"] = tools.chat_tools()
        body["parallel_tool_calls"] = req.parallel_tool_calls
    choice = req.tool_choice
    if isinstance(choice, dict):
        body["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    elif choice is not None and (tools.served or choice == "required"):
        body["tool_choice"] = choice
    return body


def _response_format(req: ResponsesRequest) -> dict[str, Any]:
    fmt = req.text.format
    if fmt.type != "json_schema":
        return {"type": fmt.type}
    spec = {"name": fmt.name, "schema": fmt.json_schema, "strict": fmt.strict, "description": fmt.description}
    return {"type": "json_schema", "json_schema": {k: v for k, v in spec.items() if v is not None}}


ID_PREFIXES = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "custom_tool_call": "ctc",
               "custom_tool_call_output": "ctco", "reasoning": "rs"}


def listed_items(items: list[InputItem]) -> list[dict[str, Any]]:
    """This request's input items as ``GET /v1/responses/{id}/input_items`` lists them: each with an
    id (the client's, or a new one) and a status, messages' text in typed parts."""
    out: list[dict[str, Any]] = []
    for item in items:
        entry: dict[str, Any] = {"id": item.id or new_id(ID_PREFIXES[item.type]), "type": item.type}
        if item.type == "message":
            kind = "output_text" if item.role == "assistant" else "input_text"
            parts = [{"type": kind, "text": part.text, **({"annotations": []} if kind == "output_text" else {})}
                     for part in item.content or []]
            entry.update(role=item.role, content=parts)
        elif item.type == "reasoning":
            entry["summary"] = item.summary or []
        elif item.type in ("function_call", "custom_tool_call"):
            entry.update(call_id=item.call_id, name=item.name)
            if item.namespace is not None:
                entry["namespace"] = item.namespace
            entry.update({"arguments": item.arguments} if item.type == "function_call" else {"input": item.input})
        else:
            entry.update(call_id=item.call_id, output=item.text)
        entry["status"] = item.status or "completed"
        out.append(entry)
    return out
