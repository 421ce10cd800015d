"""A parsed tool call, and the streaming parser contract every call format implements."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Protocol

from server.openai import response_types as rt


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text of an object, as OpenAI sends it
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def to_openai(self, index: int | None = None) -> rt.ToolCall:
        call: rt.ToolCall = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        if index is not None:
            call["index"] = index
        return call


class CallParser(Protocol):
    """Splits a choice's streamed text into content and complete calls (see ``hermes.ToolCallParser``)."""

    num_calls: int

    def feed(self, text: str) -> tuple[str, list[ToolCall]]: ...

    def finish(self) -> tuple[str, list[ToolCall]]: ...


def parse_all(parser: CallParser, text: str) -> tuple[str | None, list[ToolCall]]:
    """Content and calls of a finished output (content None when only calls were made): the
    streamed parse run over the whole text at once, so both answers always agree."""
    content, calls = parser.feed(text)
    rest, more = parser.finish()
    content, calls = content + rest, calls + more
    if calls:
        return content.strip() or None, calls
    return content, []
