"""The answer's output items (``server.generation.output_items``), which the Responses and Messages
APIs stream and return: the items do not depend on how the text arrived (one piece, or a character
at a time, as a stream might cut it), every item is started before its pieces and ended once, and
without tools the text is the model's, untouched."""

from __future__ import annotations

from server.generation.output_items import OutputItems, assemble
from server.tools.schema import Tool
from server.tools.tool_use import ToolUse
from tests.helpers.tool_data import TEXT, TOOLS


def tool_use() -> ToolUse:
    return ToolUse.from_request([Tool.model_validate(t) for t in TOOLS], "auto", True, tokenizer=None)


def fed_in_pieces(tools: ToolUse | None, text: str) -> tuple[OutputItems, list]:
    items, events = OutputItems.of(tools), []
    for char in text:
        events += items.feed(char)
    events += items.finish()
    return items, events


def summary(items: OutputItems) -> list[tuple]:
    return [(i.kind, i.name, i.text) for i in items.items]


def test_items_do_not_depend_on_how_the_text_arrived() -> None:
    whole = assemble(tool_use(), TEXT)
    items, events = fed_in_pieces(tool_use(), TEXT)
    assert summary(items) == summary(whole)
    assert [(k, n) for k, n, _ in summary(whole)] == [("text", None), ("call", "get_weather"), ("call", "get_time")]
    assert whole.items[0].text == "Let me check." and whole.items[1].text == '{"city": "Paris"}'
    assert len({i.call_id for i in whole.items[1:]}) == 2 and all(i.done for i in whole.items)
    started, ended = [], []
    for event in events:
        if event.kind == "start":
            assert event.index == len(started)  # items are numbered in order, each started once
            started.append(event.index)
        elif event.kind == "piece":
            assert event.index in started and event.index not in ended
        else:
            ended.append(event.index)
    assert started == ended == [0, 1, 2]
    pieces = {i: "".join(e.text for e in events if e.kind == "piece" and e.index == i) for i in started}
    assert [pieces[i] for i in started] == [i.text for i in items.items]


def test_without_tools_the_text_is_the_models_and_an_empty_answer_is_one_empty_text() -> None:
    text = "  a <tool_call> is just text here\n"
    items, _ = fed_in_pieces(None, text)
    assert summary(items) == [("text", None, text)]
    assert summary(assemble(None, "")) == summary(assemble(tool_use(), "")) == [("text", None, "")]
