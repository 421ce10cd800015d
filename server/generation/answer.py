"""The one output contract: a generation's deltas as changes to each choice's output items.

Every API renders the same thing. Chat completions and completions, the Responses API and the
Messages API all consume ``ChoiceUpdate`` s from ``answer_updates`` (streamed) or the items of
``assemble`` (whole); what differs is only the JSON each makes of an update. So the tool-call
parse, the whitespace rules around calls and where a choice ends are decided once, here and in
``server.generation.output_items``, and a fix to them reaches every API.

``answer_updates`` stops at the first choice that failed or was aborted (the request then ends with
an error, ``Generation.failure``); a finished choice's update carries the ends of its open items.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

from server.generation.output_items import ItemEvent, OutputItems
from server.generation.submission import Choice, Generation, ends_the_request
from server.tools.tool_use import ToolUse
from specdec_core.engine.outputs import RequestOutput


@dataclass(frozen=True)
class ChoiceUpdate:
    """What one engine delta changed in one choice's answer.

    ``events``: the item changes, in order (a finished choice's include the ends of its items);
    ``items``: the choice's items so far; ``output``: the delta itself (its logprobs and
    provenance, which a renderer puts on the first piece it sends for it)."""

    choice: Choice
    output: RequestOutput
    items: OutputItems
    events: list[ItemEvent]

    @property
    def finished(self) -> bool:
        return self.choice.finished

    @property
    def text(self) -> str:
        """The text this update added to the answer's text items."""
        return "".join(e.text for e in self.events if e.kind == "piece" and self.items.items[e.index].kind == "text")


class Answers:
    """Each choice's output items, fed that choice's deltas in order."""

    def __init__(self, tools: ToolUse | None) -> None:
        self.tools = tools
        self._items: dict[int, OutputItems] = {}

    def update(self, choice: Choice, out: RequestOutput) -> ChoiceUpdate:
        """What ``out`` (the delta ``choice`` just recorded) changed in its answer."""
        if choice.index not in self._items:
            self._items[choice.index] = OutputItems.of(self.tools)
        items = self._items[choice.index]
        events = items.feed(out.text)
        if choice.finished:
            events += items.finish()
        return ChoiceUpdate(choice, out, items, events)


async def answer_updates(generation: Generation, tools: ToolUse | None) -> AsyncIterator[ChoiceUpdate]:
    """Each choice's answer as it grows (see module docstring)."""
    answers = Answers(tools)
    async for choice, out in generation.deltas():
        if ends_the_request(out.finish_reason):
            return
        yield answers.update(choice, out)
