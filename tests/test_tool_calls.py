"""Tool calling: the Hermes/Qwen call format parsed from whole and streamed text, the grammar that
forces calls, prompt rendering with and without template support, and the real server driven by
the OpenAI SDK (tiny random models: calls are forced with tool_choice, since a random model does
not call tools by itself)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import jsonschema
import openai
import pytest
from server_helpers import ServerProcess

from server.generation.prompts import render_chat
from server.tools.calls import parse_all
from server.tools.hermes import ToolCallParser, call_grammar, has_marker_tokens


def parse_tool_calls(text: str, tools: set[str], max_calls: int | None = None):
    return parse_all(ToolCallParser(tools, max_calls), text)


MODEL = "tiny"
WEATHER = {"type": "object", "properties": {"city": {"enum": ["Paris", "Tokyo", "Lima"]},
           "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"city": {"enum": ["Paris", "Tokyo"]}, "utc": {"type": "boolean"}},
        "required": ["city", "utc"], "additionalProperties": False}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "description": "Time in a city", "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
DEEP: dict = {"type": "object"}
for _ in range(40):  # a valid schema nested beyond the depth cap (80 levels): a 400, never a RecursionError
    DEEP = {"type": "object", "properties": {"a": DEEP}}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris and the time in Tokyo?"}]
TEXT = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {"city": "Tokyo", "utc": false}}\n</tool_call>')


# ------------------------------------------------------------------------------------------ parsing

def test_calls_and_content_are_parsed_from_finished_text() -> None:
    content, calls = parse_tool_calls(TEXT, set(SCHEMAS))
    assert content == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"}), ("get_time", {"city": "Tokyo", "utc": False})]
    assert len({c.id for c in calls}) == 2 and all(c.id.startswith("call_") for c in calls)


@pytest.mark.parametrize("bad", [
    '<tool_call>\n{"name": "launch", "arguments": {}}\n</tool_call>',  # not a declared tool
    '<tool_call>\n{"name": "get_time", "arguments": {"city": \n</tool_call>',  # not JSON
    '<tool_call>\n["get_time"]\n</tool_call>',  # not an object
    '<tool_call>\n{"name": "get_time", "arguments": {"city": "Paris"}}',  # never closed
    # nested far too deeply to be a call (a grammar can make a model write this): was a RecursionError
    pytest.param('<tool_call>\n{"name": "get_time", "arguments": {"a": ' + "[" * 5000 + "]" * 5000 + '}}\n</tool_call>',
                 id="nested-5000"),
    pytest.param('<tool_call>\n{"name": "get_time", "arguments": "{\\"a\\": ' + "[" * 100 + "]" * 100 + '}"}\n</tool_call>',
                 id="nested-100-in-a-string"),
])
def test_text_that_is_not_a_call_stays_content(bad: str) -> None:
    content, calls = parse_tool_calls("Sure. " + bad, set(SCHEMAS))
    assert calls == [] and content == "Sure. " + bad


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
        content, calls = content + rest, calls + more
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
        assert content + rest == "" and [(c.name, json.loads(c.arguments)) for c in calls + more] == [
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
    assert [c.name for _, new in streamed for c in new] == ["get_weather"] and parser.num_calls == 1


def test_the_chat_renderer_keeps_one_call_and_opens_tool_streams_with_null_content(smol_tok) -> None:
    from server.generation.submission import Choice
    from server.openai.renderers import ChatRenderer
    from server.openai.bodies import TokenText

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
    deltas = [renderer.delta(0, ch, None) for ch in TEXT] + [renderer.finish(0, "stop")]
    sent = [t for d in deltas if d for t in d["delta"].get("tool_calls", [])]
    assert [(t["index"], t["function"]["name"]) for t in sent] == [(0, "get_weather")]


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


# ------------------------------------------------------------------------------------------ server

@pytest.fixture(scope="module")
def client(tiny_server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=tiny_server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _valid(call) -> None:
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def _stream(client: openai.OpenAI, **kwargs) -> tuple[str, list[dict], str | None]:
    content, calls, finish = "", {}, None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for t in delta.tool_calls or []:
            entry = calls.setdefault(t.index, {"id": "", "name": "", "arguments": ""})
            entry["id"] += t.id or ""
            entry["name"] += t.function.name or ""
            entry["arguments"] += t.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    return content, [calls[i] for i in sorted(calls)], finish


def test_a_named_function_is_called_once_with_valid_arguments(client: openai.OpenAI) -> None:
    kwargs = dict(model=MODEL, messages=MESSAGES, tools=TOOLS, max_tokens=200, temperature=0.0,
                  tool_choice={"type": "function", "function": {"name": "get_time"}})
    out = client.chat.completions.create(**kwargs)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert [c.function.name for c in choice.message.tool_calls] == ["get_time"]
    _valid(choice.message.tool_calls[0])
    content, calls, finish = _stream(client, **kwargs)
    assert finish == "tool_calls" and content == ""
    assert [(c["name"], c["arguments"]) for c in calls] == [("get_time", choice.message.tool_calls[0].function.arguments)]


def test_the_sdks_stream_helper_assembles_the_same_message(client: openai.OpenAI) -> None:
    """The SDK's own delta accumulation (strict tools, as its helpers require) ends with the
    non-streamed message: content null, the same call, arguments parsed."""
    strict = [{"type": t["type"], "function": {**t["function"], "strict": True}} for t in TOOLS]
    kwargs = dict(model=MODEL, messages=MESSAGES, tools=strict, max_tokens=200, temperature=0.0,
                  tool_choice={"type": "function", "function": {"name": "get_time"}})
    whole = client.chat.completions.create(**kwargs).choices[0].message
    with client.chat.completions.stream(**kwargs) as stream:
        final = stream.get_final_completion().choices[0]
    assert final.finish_reason == "tool_calls" and final.message.content is None
    call = final.message.tool_calls[0]
    assert (call.function.name, call.function.arguments) == (whole.tool_calls[0].function.name,
                                                             whole.tool_calls[0].function.arguments)
    assert call.function.parsed_arguments == json.loads(call.function.arguments)


def test_required_calls_validate_sampled_or_not_and_with_speculation_off(client: openai.OpenAI) -> None:
    for seed in range(4):
        kwargs = dict(model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
                      max_tokens=200, temperature=1.0, seed=seed)
        choice = client.chat.completions.create(**kwargs).choices[0]
        assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
        _valid(choice.message.tool_calls[0])
    greedy = dict(model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice="required", max_tokens=200, temperature=0.0)
    spec = client.chat.completions.create(**greedy).choices[0].message
    plain = client.chat.completions.create(**greedy, extra_body={"speculative": False}).choices[0].message
    assert [(c.function.name, c.function.arguments) for c in spec.tool_calls or []] == \
        [(c.function.name, c.function.arguments) for c in plain.tool_calls or []]
    for call in spec.tool_calls or []:
        _valid(call)


def test_auto_answers_and_tool_results_go_back(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS, max_tokens=16, temperature=0.0)
    assert out.choices[0].finish_reason in ("stop", "length", "tool_calls")
    history = MESSAGES + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": '{"city": "Tokyo", "utc": true}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "09:00"},
    ]
    out = client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS, max_tokens=8, temperature=0.0)
    assert out.choices[0].message.role == "assistant"


def test_a_bare_json_call_from_the_model_becomes_a_tool_call(client: openai.OpenAI) -> None:
    """End to end through the real server: a JSON-schema response format makes the tiny model
    write exactly a bare call object, which the auto parser turns into message.tool_calls."""
    call_schema = {"type": "object", "properties": {"name": {"const": "get_time"}, "arguments": TIME},
                   "required": ["name", "arguments"], "additionalProperties": False}
    kwargs = dict(model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice="auto", max_tokens=200, temperature=0.0,
                  response_format={"type": "json_schema", "json_schema": {"name": "call", "schema": call_schema}})
    choice = client.chat.completions.create(**kwargs).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert [c.function.name for c in choice.message.tool_calls] == ["get_time"]
    _valid(choice.message.tool_calls[0])
    content, calls, finish = _stream(client, **kwargs)
    assert (content, finish) == ("", "tool_calls")
    assert [(c["name"], c["arguments"]) for c in calls] == [("get_time", choice.message.tool_calls[0].function.arguments)]


@pytest.mark.parametrize("body, param", [
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS + TOOLS[:1]}, "tools"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"messages": [{"role": "tool", "content": "09:00"}]}, "messages[0]"),
    ({"messages": [{"role": "user", "content": "hi", "tool_call_id": "x"}]}, "messages[0]"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                                         "function": {"name": "f", "arguments": "[1]"}}]}]},
     "messages[0].tool_calls[0].function.arguments"),
    # nesting beyond the depth cap, and far beyond the recursion limit (was a 500 RecursionError)
    *[({"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {
        "name": "f", "arguments": '{"a": ' + "[" * depth + "]" * depth + "}"}}]}]},
       "messages[0].tool_calls[0].function.arguments") for depth in (100, 5000)],
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "strang"}}}]},
     "tools[0].function.parameters"),
    ({"tools": [TOOLS[0], {"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]},
     "tools[1].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "a": {"type": "string", "minLength": -1}}}}}]}, "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": DEEP}}]}, "tools[0].function.parameters"),
    # a valid schema the grammar engine cannot compile (look-ahead): refused when a call is forced
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "a": {"type": "string", "pattern": "(?=a)b"}}}}}], "tool_choice": "required"}, "tool_choice"),
])
def test_bad_tool_requests_are_400s_naming_the_field(client: openai.OpenAI, body: dict, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(**{"model": MODEL, "messages": MESSAGES, "max_tokens": 4, **body})
    assert err.value.body["param"] == param, err.value.body  # type: ignore[index]
