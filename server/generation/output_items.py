"""A choice's text as a list of output items (text, tool calls), built as the text arrives.

Chat completions answer with one message whose ``content`` and ``tool_calls`` are separate fields.
The Responses API and the Anthropic Messages API answer with an ordered list of items instead: a
``message`` / ``text`` item, then ``function_call`` / ``tool_use`` items. Both stream an item as
"added", its pieces, then "done". ``OutputItems`` turns a choice's text into that list with the
same tool-call parser chat uses (``server.tools``), and reports each change as an ``ItemEvent``
that an API's renderer maps to its own event names.

Chat completions render from the same items (text items are the message's ``content``, call items
its ``tool_calls``), so every API streams tool calls through this one builder
(``server.generation.answer`` drives it per choice). The whole (non-streamed) answer is this same
builder fed the whole text at once, so a streamed answer and a whole one assemble to the same items.

Rules beyond the parser's: without tools the text is one text item, exactly the model's text (so
greedy output equals chat's). With tools, whitespace is held back until non-whitespace text
follows (a model writes newlines around its calls; they open no item of their own). An answer
with no text and no call is one empty text item, so clients always find a message.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Literal

from server.tools.calls import CallDelta, CallParser, ToolCall
from server.tools.tool_use import ToolUse

ItemKind = Literal["text", "call"]


def new_id(prefix: str) -> str:
    """An id no client can guess: ``prefix`` and 192 random bits (OpenAI's ids carry 128 or more)."""
    return f"{prefix}_{secrets.token_hex(24)}"


@dataclass
class OutputItem:
    """One item of an answer: text, or a call (``name`` and ``call_id`` set, ``text`` its arguments)."""

    kind: ItemKind
    text: str = ""
    name: str | None = None
    call_id: str | None = None
    done: bool = False


@dataclass(frozen=True)
class ItemEvent:
    """``start``: item ``index`` was added (empty); ``piece``: ``text`` was appended to it;
    ``end``: it is complete."""

    kind: Literal["start", "piece", "end"]
    index: int
    text: str = ""


@dataclass
class OutputItems:
    """The items of one choice, fed its text deltas in order (see module docstring)."""

    parser: CallParser | None  # the tool-call parser of the request's format; None without tools
    items: list[OutputItem] = field(default_factory=list)
    _held: str = field(default="", init=False, repr=False)  # whitespace not yet in an item
    _calls: dict[int, int] = field(default_factory=dict, init=False, repr=False)  # call number -> item index

    @classmethod
    def of(cls, tools: ToolUse | None) -> "OutputItems":
        """An empty answer of a request offering ``tools`` (None: none)."""
        return cls(tools.parser() if tools is not None else None)

    @property
    def num_calls(self) -> int:
        return len(self._calls)

    def call_number(self, index: int) -> int:
        """Item ``index`` (a call) counted among the answer's calls, from 0 (chat's ``tool_calls`` index)."""
        return sum(1 for item in self.items[:index] if item.kind == "call")

    def message(self) -> tuple[str | None, list[ToolCall]]:
        """The items as one chat message: its content (None when there is none, or only whitespace
        beside calls) and its calls."""
        text = "".join(item.text for item in self.items if item.kind == "text")
        calls = [ToolCall(item.name or "", item.text, *([item.call_id] if item.call_id else []))
                 for item in self.items if item.kind == "call"]
        return (text.strip() or None, calls) if calls else (text or None, [])

    def feed(self, text: str) -> list[ItemEvent]:
        if not text:
            return []
        if self.parser is None:
            return self._text(text)
        content, calls = self.parser.feed(text)
        return self._apply(content, calls)

    def finish(self) -> list[ItemEvent]:
        """The rest of the text (a held-back call, a cut call), then every open item ends."""
        events: list[ItemEvent] = []
        if self.parser is not None:
            content, calls = self.parser.finish()
            events += self._apply(content, calls)
            if self._held and not self._calls and not self.items:  # only whitespace, no call: it is the answer
                events += self._text("", flush=True)
        if not self.items:
            events += self._start(OutputItem("text"))
        open_item = self._open()
        if open_item is not None:
            events += self._end(open_item)
        return events

    # -- building ---------------------------------------------------------------------------------
    def _apply(self, content: str, calls: list[CallDelta]) -> list[ItemEvent]:
        events = self._text(content) if content else []
        for call in calls:
            if call.name is not None:
                events += self._start(OutputItem("call", name=call.name, call_id=call.id))
                self._calls[call.index] = len(self.items) - 1
            if call.arguments:
                index = self._calls[call.index]
                self.items[index].text += call.arguments
                events.append(ItemEvent("piece", index, call.arguments))
        return events

    def _text(self, text: str, flush: bool = False) -> list[ItemEvent]:
        if self.parser is not None and not flush:
            open_item = self._open()
            if (open_item is None or open_item.kind != "text") and not text.strip():
                self._held += text
                return []
        text, self._held = self._held + text, ""
        events: list[ItemEvent] = []
        open_item = self._open()
        if open_item is None or open_item.kind != "text":
            events += self._start(OutputItem("text"))
        index = len(self.items) - 1
        self.items[index].text += text
        if text:
            events.append(ItemEvent("piece", index, text))
        return events

    def _open(self) -> OutputItem | None:
        return self.items[-1] if self.items and not self.items[-1].done else None

    def _start(self, item: OutputItem) -> list[ItemEvent]:
        open_item = self._open()
        events = self._end(open_item) if open_item is not None else []
        self.items.append(item)
        return [*events, ItemEvent("start", len(self.items) - 1)]

    def _end(self, item: OutputItem) -> list[ItemEvent]:
        item.done = True
        return [ItemEvent("end", self.items.index(item))]


def assemble(tools: ToolUse | None, text: str) -> OutputItems:
    """The items of a finished choice's whole text (what a stream of it assembles to)."""
    items = OutputItems.of(tools)
    items.feed(text)
    items.finish()
    return items
