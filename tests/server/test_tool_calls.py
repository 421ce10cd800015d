"""Tool calling: the Hermes/Qwen call format parsed from whole and streamed text, the grammar that
forces calls, and prompt rendering with and without template support (the real server:
``test_server_tool_calls.py``)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from server.generation.output_items import OutputItems
from server.generation.prompts import render_chat
from server.tools.calls import CallDelta, ToolCall
from server.tools.hermes import ToolCallParser, call_grammar, has_marker_tokens
from tests.helpers.answers import rendered
from tests.helpers.tool_data import MESSAGES, SCHEMAS, TEXT, TOOLS


def parse_tool_calls(text: str, tools: set[str], max_calls: int | None = None):
    """Content and calls of a finished text, as every API's whole answer parses it."""
    items = OutputItems(ToolCallParser(tools, max_calls))
    items.feed(text)
    items.finish()
    return items.message()


def assemble(deltas: list[CallDelta]) -> list[ToolCall]:
    """The calls that streamed pieces add up to, in index order (what a client's accumulation gives)."""
    calls: dict[int, ToolCall] = {}
    for d in deltas:
        if d.name is not None:
            calls[d.index] = ToolCall(d.name, d.arguments, d.id or "")
        else:
            calls[d.index] = ToolCall(calls[d.index].name, calls[d.index].arguments + d.arguments, calls[d.index].id)
    return [calls[i] for i in sorted(calls)]


MODEL = "tiny"


# ------------------------------------------------------------------------------------------ parsing

def test_calls_and_content_are_parsed_from_finished_text() -> None:
    content, calls = parse_tool_calls(TEXT, set(SCHEMAS))
    assert content == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"}), ("get_time", {"city": "Tokyo", "utc": False})]
    assert len({c.id for c in calls}) == 2 and all(c.id.startswith("call_") for c in calls)


@pytest.mark.parametrize("bad", [
    '<tool_call>\n{"name": "launch", "arguments": {}}\n</tool_call>',  # not a declared tool
    '<tool_call>\n["get_time"]\n</tool_call>',  # not an object
    '<tool_call>\n{"arguments": {"city": "Paris"}}\n</tool_call>',  # names nothing
    # arguments as a JSON string nested far too deeply to be a call: was a RecursionError
    pytest.param('<tool_call>\n{"name": "get_time", "arguments": "{\\"a\\": ' + "[" * 100 + "]" * 100 + '}"}\n</tool_call>',
                 id="nested-100-in-a-string"),
    '<tool_call>\n{"name": "get_ti',  # cut before the name was complete
    "<tool_c",  # a cut opening tag
])
def test_call_syntax_that_is_no_call_is_dropped_never_content(bad: str) -> None:
    """OpenAI never answers call syntax as text (clients then show it and do not run the tool)."""
    for split in (False, True):
        parser, content, calls = ToolCallParser(set(SCHEMAS)), "", []
        for piece in (list("Sure. " + bad) if split else ["Sure. " + bad]):
            text, new = parser.feed(piece)
            content, calls = content + text, calls + new
        rest, more = parser.finish()
        assert (content + rest).strip() == "Sure." and calls + more == []


@pytest.mark.parametrize("text, arguments", [
    ('<tool_call>\n{"name": "get_time", "arguments": {"city": "Pa', '{"city": "Pa'),  # cut by max_tokens
    ('<tool_call>\n{"name": "get_time", "argum', ""),  # cut before the arguments began
    ('<tool_call>\n{"name": "get_time", "arguments": {"city": "Paris"}}', '{"city": "Paris"}'),  # never closed
    ('<tool_call>\n{"name": "get_time", "arguments": {"city": \n</tool_call>', '{"city": \n'),  # broken JSON
    pytest.param('<tool_call>\n{"name": "get_time", "arguments": {"a": ' + "[" * 5000 + "]" * 5000 + '}}\n</tool_call>',
                 '{"a": ' + "[" * 5000 + "]" * 5000 + "}", id="nested-5000"),  # the text as written: no recursion
])
def test_a_cut_or_broken_call_is_a_call_with_the_arguments_written(text: str, arguments: str) -> None:
    """As OpenAI answers a call cut by max_tokens: the call, its partial arguments text."""
    content, calls = parse_tool_calls("Sure. " + text, set(SCHEMAS))
    assert content == "Sure." and [(c.name, c.arguments) for c in calls] == [("get_time", arguments)]


@pytest.mark.parametrize("text", ['```json\n{"name": "get_time", "arguments": {"city": "To',
                                  '{"name": "get_time", "arguments": {"city": "To'])
def test_a_bare_call_cut_short_is_a_call_too(text: str) -> None:
    for pieces in ([text], list(text)):
        parser, content, calls = ToolCallParser(set(SCHEMAS)), "", []
        for piece in pieces:
            c, new = parser.feed(piece)
            content, calls = content + c, calls + new
        rest, more = parser.finish()
        assert content + rest == ""
        assert [(c.name, c.arguments) for c in assemble(calls + more)] == [("get_time", '{"city": "To')]


def test_an_exact_repeat_of_a_call_ends_the_answer() -> None:
    """A small model under "required" with parallel calls repeats one call until max_tokens: the
    repeat ends the answer (the parser says so, the server stops the generation there)."""
    call = '<tool_call>\n{"name": "get_time", "arguments": {"city": "Tokyo", "utc": true}}\n</tool_call>\n'
    other = call.replace("Tokyo", "Paris")
    for pieces in ([call * 3 + "<tool_call>\n{"], list(call * 3)):
        parser, calls = ToolCallParser(set(SCHEMAS)), []
        for piece in pieces:
            calls += parser.feed(piece)[1]
        assert parser.ended and parser.finish() == ("", [])
        assert [(c.name, c.arguments) for c in assemble(calls)] == [("get_time", '{"city": "Tokyo", "utc": true}')]
    # a different call after it, or a repeat cut short, does not end it; the cut repeat is not sent
    content, calls = parse_tool_calls(call + other + call[:40], set(SCHEMAS))
    assert content is None and [json.loads(c.arguments)["city"] for c in calls] == ["Tokyo", "Paris"]


def test_streamed_text_gives_the_same_calls_and_content_wherever_it_is_split() -> None:
    rng = random.Random(0)
    text = TEXT + " Done <tool" + "_call"  # ends in something that only looks like an opening
    whole_content, whole_calls = parse_tool_calls(text, set(SCHEMAS))
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(text)), rng.randint(1, 12)))
        parser, content, calls = ToolCallParser(set(SCHEMAS)), "", []
        for a, b in zip([0] + cuts, cuts + [len(text)]):
            piece, new = parser.feed(text[a:b])
            content += piece
            calls += new
        rest, more = parser.finish()
        content, calls = content + rest, assemble(calls + more)
        assert content.strip() == whole_content
        assert [(c.name, c.arguments) for c in calls] == [(c.name, c.arguments) for c in whole_calls]


@pytest.mark.parametrize("text", [
    '```json\n{\n  "name": "get_time",\n  "arguments": {"city": "Tokyo", "utc": true}\n}\n```',
    '{"name": "get_time", "arguments": {"city": "Tokyo", "utc": true}}',
])
def test_a_whole_answer_that_is_one_bare_call_is_that_call(text: str) -> None:
    """Qwen2.5-Coder-1.5B answers tool_choice auto with a fenced JSON call instead of tags."""
    for pieces in ([text], list(text)):  # whole, and streamed a character at a time
        parser, content, calls = ToolCallParser(set(SCHEMAS)), "", []
        for piece in pieces:
            c, new = parser.feed(piece)
            content, calls = content + c, calls + new
        rest, more = parser.finish()
        assert content + rest == "" and [(c.name, json.loads(c.arguments)) for c in assemble(calls + more)] == [
            ("get_time", {"city": "Tokyo", "utc": True})]


@pytest.mark.parametrize("text", ['```json\n{"city": "Tokyo"}\n```', '{"name": "launch", "arguments": {}}',
                                  '{"name": "get_time", "arguments": {}} and more', "```python\nprint(1)\n```"])
def test_json_that_is_not_exactly_one_call_stays_content(text: str) -> None:
    assert parse_tool_calls(text, set(SCHEMAS)) == (text, [])


def test_without_parallel_calls_only_the_first_call_is_kept_whole_or_streamed() -> None:
    """parallel_tool_calls: false under "auto", where no grammar holds the model to one call."""
    content, calls = parse_tool_calls(TEXT, set(SCHEMAS), max_calls=1)
    assert content == "Let me check." and [c.name for c in calls] == ["get_weather"]
    parser = ToolCallParser(set(SCHEMAS), max_calls=1)
    streamed = [parser.feed(ch) for ch in TEXT] + [parser.finish()]
    assert "".join(c for c, _ in streamed).strip() == "Let me check."
    assert [c.name for c in assemble([d for _, new in streamed for d in new])] == ["get_weather"]
    assert parser.num_calls == 1


def test_the_chat_renderer_keeps_one_call_and_opens_tool_streams_with_null_content(smol_tok) -> None:
    from server.generation.submission import Choice
    from server.openai.bodies import TokenText
    from server.openai.renderers import ChatRenderer
    from server.tools.schema import Tool
    from server.tools.tool_use import ToolUse

    tool_use = ToolUse.from_request([Tool.model_validate(t) for t in TOOLS], "auto", False, smol_tok)
    renderer = ChatRenderer(TokenText(smol_tok), False, tool_use)
    assert renderer.opening([0]) == [[{"index": 0, "delta": {"role": "assistant", "content": None},
                                       "logprobs": None, "finish_reason": None}]]
    assert ChatRenderer(TokenText(smol_tok), False).opening([0])[0][0]["delta"]["content"] == ""
    choice = renderer.choice(Choice(index=0, prompt_tokens=1, counts_prompt=True, text=[TEXT], finish_reason="stop"))
    assert choice["finish_reason"] == "tool_calls"
    assert [c["function"]["name"] for c in choice["message"]["tool_calls"]] == ["get_weather"]
    chunks = [c for sent in rendered(renderer, [*TEXT, ""]) for c in sent]
    sent = [t for c in chunks for t in c["delta"].get("tool_calls", [])]
    # OpenAI's shape: a first piece with id, type and name and arguments "", then arguments text only
    assert sent[0] == {"index": 0, "id": sent[0]["id"], "type": "function",
                       "function": {"name": "get_weather", "arguments": ""}}
    assert len(sent) > 3 and all(set(t) == {"index", "function"} and set(t["function"]) == {"arguments"}
                                 for t in sent[1:])
    assert "".join(t["function"]["arguments"] for t in sent) == choice["message"]["tool_calls"][0]["function"]["arguments"]
    assert [c["finish_reason"] for c in chunks] == [None] * (len(chunks) - 1) + ["tool_calls"]


# ------------------------------------------------------------------------------------------ grammar

def _matcher(tokenizer, grammar: str):
    import llguidance
    import llguidance.hf

    ll = llguidance.hf.from_tokenizer(tokenizer, n_vocab=len(tokenizer))
    compiled = llguidance.LLMatcher.grammar_from_lark(grammar)
    assert llguidance.LLMatcher.validate_grammar(compiled, ll) == ""
    return llguidance.LLMatcher(ll, compiled)


def _accepts(tokenizer, grammar: str, text: str) -> bool:
    ids = tokenizer.encode(text, add_special_tokens=False)
    return _matcher(tokenizer, grammar).validate_tokens(ids) == len(ids)


CALL = '<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call>'


@pytest.fixture(scope="module")
def smol_tok(smol_tokenizer_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smol_tokenizer_dir)


@pytest.fixture(scope="module")
def marker_tok(smol_tokenizer_dir: Path):
    """A tokenizer with <tool_call> and </tool_call> as single added tokens, as Qwen2.5's."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smol_tokenizer_dir)
    tok.add_tokens(["<tool_call>", "</tool_call>"])
    return tok


@pytest.mark.parametrize("which", ["smol_tok", "marker_tok"])
def test_the_call_grammar_accepts_exactly_valid_calls(which: str, request: pytest.FixtureRequest) -> None:
    tok = request.getfixturevalue(which)
    assert has_marker_tokens(tok) == (which == "marker_tok")
    fns = [t["function"] for t in TOOLS]
    one = call_grammar(fns, ["get_time"], parallel=False, special_markers=has_marker_tokens(tok))
    anyof = call_grammar(fns, list(SCHEMAS), parallel=True, special_markers=has_marker_tokens(tok))
    good_time = CALL.format(name="get_time", args='{"city": "Tokyo", "utc": true}')
    good_weather = CALL.format(name="get_weather", args='{"city": "Lima", "unit": "celsius"}')
    assert _accepts(tok, one, good_time)
    assert not _accepts(tok, one, good_weather)  # the named function only
    assert not _accepts(tok, one, good_time + "\n" + good_time)  # exactly one call
    assert not _accepts(tok, one, CALL.format(name="get_time", args='{"city": "Tokyo"}')[:-12] + "}\n</tool_call>")
    assert not _accepts(tok, one, CALL.format(name="get_time", args='{"city": "Oslo", "utc": true}'))
    assert not _accepts(tok, one, CALL.format(name="get_time", args='{"city": "Tokyo", "utc": true, "x": 1}'))
    assert _accepts(tok, anyof, good_weather + "\n" + good_time)
    assert not _accepts(tok, anyof, "Sure! " + good_weather)
    # The newline Qwen2.5 writes after a call may end the answer, one newline and no more.
    assert _accepts(tok, one, good_time + "\n") and _accepts(tok, anyof, good_weather + "\n" + good_time + "\n")
    assert not _accepts(tok, anyof, good_weather + "\n\n")


# ------------------------------------------------------------------------------------------ prompts

def _render_with_tools(tokenizer, messages: list[dict]) -> list[int]:
    from server.tools.schema import Tool
    from server.tools.tool_use import ToolUse

    tool_use = ToolUse.from_request([Tool.model_validate(t) for t in TOOLS], "auto", True, tokenizer)
    messages, template_kwargs = tool_use.prompt_messages(messages)
    return render_chat(tokenizer, messages, template_kwargs=template_kwargs, special_tokens_in_content=False)


def test_a_template_without_tools_gets_the_fallback_prompt(smol_tok) -> None:
    history = MESSAGES + [
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": {"city": "Tokyo", "utc": False}}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "09:00"},
    ]
    text = smol_tok.decode(_render_with_tools(smol_tok, history))
    assert '"name": "get_weather"' in text and "<tool_call>" in text  # tools and format, in a system turn
    assert '{"name": "get_time", "arguments": {"city": "Tokyo", "utc": false}}' in text  # the past call
    assert "<tool_response>\n09:00\n</tool_response>" in text  # the result


def test_a_template_that_takes_tools_renders_them_itself(smol_tokenizer_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smol_tokenizer_dir)
    tok.chat_template = ("{% for t in tools %}TOOL {{ t.function.name }}\n{% endfor %}"
                         "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}")
    text = tok.decode(_render_with_tools(tok, MESSAGES))
    assert text.startswith("TOOL get_weather\nTOOL get_time\nuser:")
