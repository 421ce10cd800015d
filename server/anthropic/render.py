"""The Messages API's answer: the ``message`` object, and the events that stream it.

Field names and the event order follow the anthropic SDK's own types (``anthropic.types``), which
its ``messages.stream`` helper accumulates: ``message_start`` (the message with no content yet),
a ``ping``, then per content block ``content_block_start``, ``content_block_delta`` s
(``text_delta``, or ``input_json_delta`` for a ``tool_use`` block's input as the model writes it)
and ``content_block_stop``; then ``message_delta`` with ``stop_reason``, ``stop_sequence`` and the
usage, and ``message_stop``. Every event is named (``event: message_start``); a failure after the
stream started is an ``error`` event in Anthropic's shape, and the stream ends there.

The blocks come from ``server.generation.output_items`` (the same items the Responses API and a
whole answer get). ``stop_reason``: ``max_tokens`` when the budget ended it, ``tool_use`` when it
called a tool, ``stop_sequence`` (naming it) when one of ``stop_sequences`` did,
``model_context_window_exceeded`` when the context ended it before ``max_tokens`` (a ``max_tokens``
beyond the room the prompt leaves is lowered to it, as Anthropic's API does), else ``end_turn``.
Usage follows Anthropic's split of the prompt: ``cache_read_input_tokens`` the prefix cache served,
``cache_creation_input_tokens`` this request computed and wrote into it (its full KV blocks, which
the next turn can read), ``input_tokens`` the rest (the last partial block); their sum is the
prompt. Every prompt is cached this way, ``cache_control`` marks or not.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from server.generation.answer import answer_updates
from server.generation.output_items import OutputItem, OutputItems, assemble
from server.generation.streaming import NamedEvent
from server.generation.submission import Choice, Generation
from server.http.errors import APIError
from server.http.jsonio import loads_bounded
from server.tools.tool_use import ToolUse


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as the ``input`` object; ``{}`` when they are not one (a call cut short)."""
    try:
        value = loads_bounded(arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def block_json(item: OutputItem, *, opening: bool = False) -> dict[str, Any]:
    if item.kind == "text":
        return {"type": "text", "text": "" if opening else item.text}
    return {"type": "tool_use", "id": item.call_id, "name": item.name, "input": {} if opening else tool_input(item.text)}


@dataclass
class MessageAnswer:
    """One message being generated (see module docstring)."""

    message_id: str
    model: str
    generation: Generation
    tools: ToolUse | None
    stop_sequences: list[str]
    tokenizer: Any
    max_tokens: int

    def body(self) -> dict[str, Any]:
        """The non-streamed message of a finished generation."""
        choice = self.generation.choices[0]
        items = assemble(self.tools, "".join(choice.text)).items
        reason, sequence = self._stop(choice, items)
        return {**self._message([block_json(item) for item in items], reason, sequence), "usage": self._usage(final=True),
                "speculative": self.generation.speculative()}

    async def events(self) -> AsyncIterator[NamedEvent]:
        """The stream's events (see module docstring)."""
        yield self._event("message_start", message={**self._message([], None, None), "usage": self._usage(final=False)})
        yield self._event("ping")
        items = OutputItems.of(self.tools)  # what the message holds when no update came
        async for update in answer_updates(self.generation, self.tools):
            items = update.items
            for event in self._block_events(items, update.events):
                yield event
        failure = self.generation.failure()
        if failure is not None:
            yield self.error(failure)
            return
        reason, sequence = self._stop(self.generation.choices[0], items.items)
        usage = self._usage(final=True)
        yield self._event("message_delta", delta={"stop_reason": reason, "stop_sequence": sequence}, usage=usage,
                          speculative=self.generation.speculative())
        yield self._event("message_stop")

    def error(self, err: APIError) -> NamedEvent:
        return NamedEvent("error", err.anthropic_body())

    # -- pieces -------------------------------------------------------------------------------------
    def _message(self, content: list[dict[str, Any]], reason: str | None, sequence: str | None) -> dict[str, Any]:
        return {"id": self.message_id, "type": "message", "role": "assistant", "model": self.model, "content": content,
                "stop_reason": reason, "stop_sequence": sequence}

    def _usage(self, *, final: bool) -> dict[str, Any]:
        generation = self.generation
        cached, stored = (generation.cached_tokens, generation.stored_tokens) if final else (0, 0)
        return {"input_tokens": generation.prompt_tokens - cached - stored,
                "output_tokens": generation.completion_tokens if final else 0,
                "cache_read_input_tokens": cached, "cache_creation_input_tokens": stored}

    def _stop(self, choice: Choice, items: list[OutputItem]) -> tuple[str, str | None]:
        if choice.finish_reason == "length":
            return ("max_tokens" if choice.num_tokens >= self.max_tokens else "model_context_window_exceeded"), None
        if any(item.kind == "call" for item in items):
            return "tool_use", None
        sequence = matched_stop(self.tokenizer, choice, self.stop_sequences)
        return ("stop_sequence", sequence) if sequence is not None else ("end_turn", None)

    def _block_events(self, items: OutputItems, changes: list) -> list[NamedEvent]:
        events = []
        for change in changes:
            item = items.items[change.index]
            if change.kind == "start":
                events.append(self._event("content_block_start", index=change.index, content_block=block_json(item, opening=True)))
            elif change.kind == "piece":
                delta = ({"type": "text_delta", "text": change.text} if item.kind == "text"
                         else {"type": "input_json_delta", "partial_json": change.text})
                events.append(self._event("content_block_delta", index=change.index, delta=delta))
            else:
                events.append(self._event("content_block_stop", index=change.index))
        return events

    @staticmethod
    def _event(event_type: str, **payload: Any) -> NamedEvent:
        return NamedEvent(event_type, {"type": event_type, **payload})


def matched_stop(tokenizer: Any, choice: Choice, stops: list[str]) -> str | None:
    """The stop sequence that ended a choice, if one did. The engine cuts the text where a stop
    string first ends and says only "stop" (as it does for EOS), so the generated tokens are decoded
    and the stop string that ends first in them is the one (none occurs when EOS ended it)."""
    if choice.finish_reason != "stop" or not stops:
        return None
    text = tokenizer.decode(choice.token_ids)
    found = [(at + len(stop), stop) for stop in stops if (at := text.find(stop)) >= 0]
    return min(found)[1] if found else None
