"""The Responses API's answer: the ``response`` object, and the typed events that stream it.

Field names and the event order follow the openai SDK's own types (``openai.types.responses``),
which is what its stream helpers (``responses.stream``) and the Agents SDK read:

``response.created`` and ``response.in_progress`` (the response so far, no output), then per output
item ``response.output_item.added``; for a message ``response.content_part.added``,
``response.output_text.delta`` s, ``response.output_text.done``, ``response.content_part.done``;
for a call ``response.function_call_arguments.delta`` s and ``.done``; then
``response.output_item.done`` with the whole item; last ``response.completed`` (or
``response.incomplete`` when ``max_output_tokens`` cut it, as OpenAI) with the full response and
its usage. Every event carries its ``sequence_number``. A failure after the stream started is an
``error`` event, and the stream ends there.

The items come from ``server.generation.output_items``, so a streamed answer and a whole one hold
the same items; specdec's ``speculative`` report rides on the response object.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from server.generation.answer import answer_updates
from server.generation.output_items import OutputItem, OutputItems, assemble, new_id
from server.generation.streaming import NamedEvent
from server.generation.submission import Generation
from server.http.errors import APIError
from server.openai.responses_input import ConversationItem
from server.openai.responses_tools import ResponsesTools, custom_input
from server.openai.schemas.responses import SERVED_TOOL_TYPES, ResponsesRequest, ResponsesTool
from server.tools.tool_use import ToolUse

INT64 = 2**63


def json_safe(value: Any) -> Any:
    """``value`` with integers beyond 64 bits as floats (the JSON encoder takes no larger ones; a
    client's tool schema may hold them)."""
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, list):
        return [json_safe(item) for item in value]
    if isinstance(value, int) and not isinstance(value, bool) and not -INT64 <= value < INT64:
        return float(value)
    return value


def tool_json(tool: ResponsesTool) -> dict[str, Any]:
    """A served tool as the response object lists it."""
    if tool.type == "namespace":
        return {"type": "namespace", "name": tool.name, "description": tool.description,
                "tools": [tool_json(inner) for inner in tool.tools or []]}
    if tool.type == "custom":
        fmt = tool.format.model_dump(exclude_none=True) if tool.format is not None else {"type": "text"}
        return {"type": "custom", "name": tool.name, "description": tool.description, "format": fmt}
    return {"type": "function", "name": tool.name, "description": tool.description,
            "parameters": json_safe(tool.parameters or {"type": "object", "properties": {}}),
            "strict": tool.strict if tool.strict is not None else True}


def head(response_id: str, model: str, req: ResponsesRequest) -> dict[str, Any]:
    """The fields of the response object that echo its request (fixed before generation): every
    field OpenAI's object has, the sampling ones this server does not take at their neutral value
    (the Open Responses spec requires them all). Tools it left out are not listed."""
    fmt = req.text.format
    text_format: dict[str, Any] = {"type": fmt.type}
    if fmt.type == "json_schema":
        text_format.update(name=fmt.name, schema=json_safe(fmt.json_schema), strict=fmt.strict, description=fmt.description)
    choice = req.tool_choice if req.tool_choice is not None else "auto"
    reasoning = req.reasoning
    return {
        "id": response_id, "object": "response", "created_at": int(time.time()), "model": model,
        "instructions": req.instructions, "max_output_tokens": req.max_output_tokens, "metadata": req.metadata,
        "parallel_tool_calls": req.parallel_tool_calls, "previous_response_id": req.previous_response_id,
        "reasoning": {"effort": reasoning.effort if reasoning else None, "summary": reasoning.summary if reasoning else None},
        "store": req.store, "temperature": req.temperature, "top_p": req.top_p, "truncation": "disabled",
        "text": {"format": text_format, "verbosity": req.text.verbosity or "medium"},
        "tool_choice": choice, "user": req.user, "background": False, "service_tier": "default",
        "tools": [tool_json(t) for t in req.tools if t.type in SERVED_TOOL_TYPES],
        "presence_penalty": 0.0, "frequency_penalty": 0.0, "top_logprobs": 0, "max_tool_calls": None,
        "safety_identifier": req.safety_identifier, "prompt_cache_key": req.prompt_cache_key,
    }


def usage(generation: Generation) -> dict[str, Any]:
    return {
        "input_tokens": generation.prompt_tokens,
        "input_tokens_details": {"cached_tokens": generation.cached_tokens},
        "output_tokens": generation.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": generation.prompt_tokens + generation.completion_tokens,
    }


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def item_json(item: OutputItem, item_id: str, status: str, tools: ResponsesTools) -> dict[str, Any]:
    """An output item; a call as the item its tool's type answers with (``server.openai.responses_tools``)."""
    if item.kind == "text":
        content = [text_part(item.text)] if status != "in_progress" else []
        return {"id": item_id, "type": "message", "status": status, "role": "assistant", "content": content}
    tool = tools.by_function(item.name or "")
    out: dict[str, Any] = {"id": item_id, "type": "function_call", "status": status, "call_id": item.call_id,
                           "name": tool.name if tool is not None else item.name}
    if tool is not None and tool.namespace is not None:
        out["namespace"] = tool.namespace
    if tool is not None and tool.kind == "custom":
        return {**out, "type": "custom_tool_call", "input": custom_input(item.text) if status != "in_progress" else ""}
    return {**out, "arguments": item.text}


def is_custom(item: OutputItem, tools: ResponsesTools) -> bool:
    tool = tools.by_function(item.name or "") if item.kind == "call" else None
    return tool is not None and tool.kind == "custom"


def conversation_items(items: list[OutputItem]) -> list[ConversationItem]:
    """An answer's items as the conversation continues them (``server.openai.responses_input``)."""
    return [ConversationItem("message", "assistant", item.text) if item.kind == "text"
            else ConversationItem("function_call", call_id=item.call_id, name=item.name, arguments=item.text)
            for item in items]


# Called with the finished response object and its output items (the route stores them).
OnDone = Callable[[dict[str, Any], list[OutputItem]], None]


@dataclass
class ResponseAnswer:
    """One response being generated: its object, streamed or whole (see module docstring)."""

    head: dict[str, Any]
    generation: Generation
    tool_use: ToolUse | None
    tools: ResponsesTools
    on_done: OnDone
    _seq: int = field(default=0, init=False)
    _ids: list[str] = field(default_factory=list, init=False)

    def body(self) -> dict[str, Any]:
        """The non-streamed response of a finished generation."""
        choice = self.generation.choices[0]
        items = assemble(self.tool_use, "".join(choice.text)).items
        self._ids = [self._new_item_id(item) for item in items]
        return self._finished(items, choice.finish_reason)

    async def events(self) -> AsyncIterator[NamedEvent]:
        """The stream's events (see module docstring)."""
        opening = self._response("in_progress", [])
        yield self._event("response.created", response=opening)
        yield self._event("response.in_progress", response=opening)
        items = OutputItems.of(self.tool_use)  # what the response holds when no update came
        async for update in answer_updates(self.generation, self.tool_use):
            items = update.items
            for event in self._item_events(items, update.events, update.choice.finish_reason if update.finished else None):
                yield event
        failure = self.generation.failure()
        if failure is not None:
            yield self.error(failure)
            return
        final = self._finished(items.items, self.generation.choices[0].finish_reason)
        kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        yield self._event(kind, response=final)

    def error(self, err: APIError) -> NamedEvent:
        """The ``error`` event a failure mid-stream becomes."""
        return self._event("error", code=err.code, message=err.message, param=err.param)

    # -- pieces -------------------------------------------------------------------------------------
    def _finished(self, items: list[OutputItem], finish_reason: str | None) -> dict[str, Any]:
        incomplete = finish_reason == "length"
        output = [item_json(item, self._ids[i], self._status(i, len(items), finish_reason), self.tools)
                  for i, item in enumerate(items)]
        body = self._response("incomplete" if incomplete else "completed", output)
        body.update(usage=usage(self.generation), speculative=self.generation.speculative(), completed_at=int(time.time()))
        if incomplete:
            body["incomplete_details"] = {"reason": "max_output_tokens"}
        self.on_done(body, items)
        return body

    def _response(self, status: str, output: list[dict[str, Any]]) -> dict[str, Any]:
        return {**self.head, "status": status, "output": output, "error": None, "incomplete_details": None,
                "usage": None, "completed_at": None}

    @staticmethod
    def _status(index: int, count: int, finish_reason: str | None) -> str:
        """An item is complete, but the last one of an answer cut by ``max_output_tokens``."""
        return "incomplete" if finish_reason == "length" and index == count - 1 else "completed"

    def _new_item_id(self, item: OutputItem) -> str:
        return new_id("msg" if item.kind == "text" else "ctc" if is_custom(item, self.tools) else "fc")

    def _item_events(self, items: OutputItems, changes: list, finish_reason: str | None) -> list[NamedEvent]:
        events: list[NamedEvent] = []
        for change in changes:
            item, index = items.items[change.index], change.index
            if change.kind == "start":
                self._ids.append(self._new_item_id(item))
                events.append(self._event("response.output_item.added", output_index=index,
                                          item=item_json(item, self._ids[index], "in_progress", self.tools)))
                if item.kind == "text":
                    events.append(self._event("response.content_part.added", item_id=self._ids[index], output_index=index,
                                              content_index=0, part=text_part("")))
            elif change.kind == "piece":
                where = {"item_id": self._ids[index], "output_index": index}
                if item.kind == "text":
                    events.append(self._event("response.output_text.delta", **where, content_index=0, delta=change.text,
                                              logprobs=[]))
                elif not is_custom(item, self.tools):  # a custom call's input is whole only at its end
                    events.append(self._event("response.function_call_arguments.delta", **where, delta=change.text))
            else:
                events += self._item_done(item, index, finish_reason, len(items.items))
        return events

    def _item_done(self, item: OutputItem, index: int, finish_reason: str | None, count: int) -> list[NamedEvent]:
        where = {"item_id": self._ids[index], "output_index": index}
        status = self._status(index, count, finish_reason) if finish_reason is not None else "completed"
        done = item_json(item, self._ids[index], status, self.tools)
        if done["type"] == "message":
            events = [self._event("response.output_text.done", **where, content_index=0, text=item.text, logprobs=[]),
                      self._event("response.content_part.done", **where, content_index=0, part=text_part(item.text))]
        elif done["type"] == "custom_tool_call":
            events = [self._event("response.custom_tool_call_input.delta", **where, delta=done["input"]),
                      self._event("response.custom_tool_call_input.done", **where, input=done["input"])]
        else:
            events = [self._event("response.function_call_arguments.done", **where, name=done["name"], arguments=item.text)]
        events.append(self._event("response.output_item.done", output_index=index, item=done))
        return events

    def _event(self, event_type: str, **payload: Any) -> NamedEvent:
        event = NamedEvent(event_type, {"type": event_type, "sequence_number": self._seq, **payload})
        self._seq += 1
        return event
