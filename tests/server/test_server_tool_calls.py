"""Tool calling through the real server, driven by the OpenAI SDK (tiny random models: calls are
forced with tool_choice, since a random model does not call tools by itself): calls never reach
content, stream as OpenAI streams them, a cut call comes back as a call, a repeat ends the answer."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.helpers.servers import ServerProcess
from tests.helpers.tool_data import DEEP, MESSAGES, SCHEMAS, TIME, TOOLS

MODEL = "tiny"


@pytest.fixture(scope="module")
def client(tiny_server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=tiny_server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _valid(call) -> None:
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def _stream(client: openai.OpenAI, **kwargs) -> tuple[str, list[dict], str | None]:
    """Content, calls and finish reason of a streamed answer, accumulated as clients do; each call
    also lists the ``pieces`` it arrived in (the first must name it with arguments "", as OpenAI's)."""
    content, calls, finish = "", {}, None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for t in delta.tool_calls or []:
            entry = calls.setdefault(t.index, {"id": "", "name": "", "arguments": "", "pieces": []})
            if not entry["pieces"]:
                assert t.id and t.type == "function" and t.function.name and t.function.arguments == "", t
            else:
                assert t.id is None and t.function.name is None, t
            entry["pieces"].append(t.function.arguments)
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
    assert len(calls[0]["pieces"]) > 3  # the arguments streamed as they were written, not whole at the end


@pytest.mark.parametrize("max_tokens", [25, 50])
def test_a_call_cut_by_max_tokens_is_a_call_never_content(client: openai.OpenAI, max_tokens: int) -> None:
    """Was: the unfinished <tool_call> block as message.content (LangChain showed it, the AI SDK did
    not run the tool). Now, as OpenAI: the call with the arguments written so far, "length"."""
    kwargs = dict(model=MODEL, messages=MESSAGES, tools=TOOLS, temperature=0.0,
                  tool_choice={"type": "function", "function": {"name": "get_time"}})
    full = client.chat.completions.create(max_tokens=200, **kwargs).choices[0].message.tool_calls[0].function.arguments
    choice = client.chat.completions.create(max_tokens=max_tokens, **kwargs).choices[0]
    assert choice.finish_reason == "length" and choice.message.content is None
    calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
    assert all(name == "get_time" and full.startswith(arguments) and arguments != full for name, arguments in calls)
    content, streamed, finish = _stream(client, max_tokens=max_tokens, **kwargs)
    assert (content, finish) == ("", "length")
    assert [(c["name"], c["arguments"]) for c in streamed] == calls


def test_an_exact_repeat_ends_a_required_answer_with_parallel_calls(client: openai.OpenAI) -> None:
    """The tiny model, forced to call a tool that takes no arguments with parallel calls allowed,
    writes the same call again: the repeat ends the answer (was: calls until max_tokens). The tokens
    before it are the model's own: the same with speculation off."""
    ping = [{"type": "function", "function": {"name": "ping", "parameters": {
        "type": "object", "properties": {}, "additionalProperties": False}}}]
    kwargs = dict(model=MODEL, messages=MESSAGES, tools=ping, tool_choice="required", max_tokens=200, temperature=0.0)
    out = client.chat.completions.create(**kwargs)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls" and [c.function.name for c in choice.message.tool_calls] == ["ping"]
    assert out.usage.completion_tokens < 200
    plain = client.chat.completions.create(**kwargs, extra_body={"speculative": False}).choices[0]
    assert [c.function.arguments for c in plain.message.tool_calls] == [choice.message.tool_calls[0].function.arguments]
    content, calls, finish = _stream(client, **kwargs)
    assert (content, finish) == ("", "tool_calls")
    assert [(c["name"], c["arguments"]) for c in calls] == [("ping", choice.message.tool_calls[0].function.arguments)]


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

