"""A parsed tool call, its streamed pieces, and the streaming parser contract every call format implements.

The parser is driven by ``server.generation.output_items`` for every API, streamed or whole."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Protocol

from server.api import response_types as rt


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text of an object as the model wrote it (OpenAI's format); partial when cut off
    id: str = field(default_factory=new_call_id)

    def to_openai(self, index: int | None = None) -> rt.ToolCall:
        call: rt.ToolCall = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        if index is not None:
            call["index"] = index
        return call


@dataclass(frozen=True)
class CallDelta:
    """One streamed piece of call ``index`` (numbered within its choice). The first piece of a
    call names it (``id`` and ``name`` set, ``arguments`` usually ""); later ones append
    ``arguments`` text as the model's output is accepted, as OpenAI streams calls."""

    index: int
    arguments: str
    name: str | None = None
    id: str | None = None

    def to_openai(self) -> rt.ToolCallDelta:
        if self.name is None:
            return {"index": self.index, "function": {"arguments": self.arguments}}
        return {"index": self.index, "id": self.id or "", "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


class CallParser(Protocol):
    """Splits a choice's streamed text into content and call pieces (see ``hermes_parser.ToolCallParser``).

    ``ended``: the answer is complete although the model goes on (it repeated a call exactly); the
    generation should stop there, and any text fed after it is ignored."""

    num_calls: int
    ended: bool

    def feed(self, text: str) -> tuple[str, list[CallDelta]]: ...

    def finish(self) -> tuple[str, list[CallDelta]]: ...
