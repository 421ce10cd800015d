"""``/v1/messages`` (Anthropic's Messages API) through a real ``specdec serve`` of the tiny draft pair,
driven by the real anthropic SDK with the key as ``x-api-key``: greedy text equal to chat's for the
same conversation and to speculation off, ``messages.stream`` reassembling the same message, a
``tool_use``/``tool_result`` round trip, ``stop_sequences``, ``count_tokens``, and errors in
Anthropic's shape. The server is ``keyed_server`` (tests/server/conftest.py), one process for
this module and test_responses_api.py."""

from __future__ import annotations

import json

import anthropic
import httpx
import jsonschema
import openai
import pytest

from tests.helpers.servers import KEYED_API_KEY, ServerProcess
from tests.helpers.tool_data import CITY_TIME

MODEL = "tiny"

# The SDK no longer takes sampling fields as arguments; the API (and this server) still does.
GREEDY = {"extra_body": {"temperature": 0.0}}
TOOLS = [{"name": "get_time", "description": "Time in a city", "input_schema": CITY_TIME}]
CHAT_TOOLS = [{"type": "function", "function": {"name": "get_time", "description": "Time in a city", "parameters": CITY_TIME}}]
ASK = [{"role": "user", "content": "What time is it in Paris?"}]


@pytest.fixture(scope="module")
def client(keyed_server: ServerProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=keyed_server.url, api_key=KEYED_API_KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def chat(keyed_server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=keyed_server.url + "/v1", api_key=KEYED_API_KEY, max_retries=0, timeout=120)


def chat_answer(chat: openai.OpenAI, messages: list[dict], max_tokens: int, **extra: object):
    return chat.chat.completions.create(model=MODEL, messages=messages, max_tokens=max_tokens, temperature=0.0, **extra)


def test_text_equals_chat_and_speculation_off(client: anthropic.Anthropic, chat: openai.OpenAI) -> None:
    kwargs = dict(model=MODEL, system="Be brief.", max_tokens=12, messages=[{"role": "user", "content": "Tell me a story."}])
    m = client.messages.create(**kwargs, **GREEDY)
    same = chat_answer(chat, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell me a story."}], 12)
    assert [b.type for b in m.content] == ["text"] and m.content[0].text == same.choices[0].message.content
    assert m.id.startswith("msg_") and m.role == "assistant" and m.model == MODEL
    assert m.stop_reason == "max_tokens" and m.stop_sequence is None and m.usage.output_tokens == 12
    # Anthropic's split: computed + written to the cache + served from it = the prompt chat counts
    usage = m.usage
    assert usage.input_tokens + usage.cache_creation_input_tokens + usage.cache_read_input_tokens == same.usage.prompt_tokens
    off = client.messages.create(**kwargs, extra_body={"temperature": 0.0, "speculative": False})
    assert off.content[0].text == m.content[0].text
    assert m.model_extra["speculative"]["method"] != "none" and off.model_extra["speculative"]["method"] == "none"
    counted = client.messages.count_tokens(model=MODEL, system="Be brief.", messages=kwargs["messages"])
    assert counted.input_tokens == same.usage.prompt_tokens


def test_stream_events_reassemble_the_message(client: anthropic.Anthropic) -> None:
    kwargs = dict(model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "Count to ten."}])
    whole = client.messages.create(**kwargs, **GREEDY)
    events = list(client.messages.create(stream=True, **kwargs, **GREEDY))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["message_start", "content_block_start"] and kinds[-3:] == ["content_block_stop", "message_delta",
                                                                                    "message_stop"]
    assert set(kinds[2:-3]) == {"content_block_delta"} and len(kinds) > 6
    assert events[-2].delta.stop_reason == "max_tokens" and events[-2].usage.output_tokens == 10
    with client.messages.stream(**kwargs, **GREEDY) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == whole.content[0].text == final.content[0].text and final.stop_reason == "max_tokens"


def test_tool_use_and_tool_result_round_trip(client: anthropic.Anthropic, chat: openai.OpenAI) -> None:
    forced = {"type": "tool", "name": "get_time"}
    with client.messages.stream(model=MODEL, max_tokens=200, messages=ASK, tools=TOOLS, tool_choice=forced,
                                **GREEDY) as stream:
        pieces = [e.delta.partial_json for e in stream if e.type == "content_block_delta" and e.delta.type == "input_json_delta"]
        m = stream.get_final_message()
    assert m.stop_reason == "tool_use" and [b.type for b in m.content] == ["tool_use"]
    use = m.content[0]
    assert use.name == "get_time" and len(pieces) > 1 and json.loads("".join(pieces)) == use.input
    jsonschema.validate(use.input, CITY_TIME)
    answer = client.messages.create(
        model=MODEL, max_tokens=8, tools=TOOLS, **GREEDY,
        messages=[*ASK, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "12:00"}]}])
    calls = [{"id": use.id, "type": "function", "function": {"name": "get_time", "arguments": json.dumps(use.input)}}]
    same = chat_answer(chat, [*ASK, {"role": "assistant", "content": None, "tool_calls": calls},
                              {"role": "tool", "tool_call_id": use.id, "content": "12:00"}], 8, tools=CHAT_TOOLS)
    assert answer.content[0].text == same.choices[0].message.content


def test_a_stop_sequence_is_named(client: anthropic.Anthropic, chat: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Say something."}]
    text = client.messages.create(model=MODEL, max_tokens=16, messages=messages, **GREEDY).content[0].text
    stop = text[6:9]  # some text the greedy answer writes
    m = client.messages.create(model=MODEL, max_tokens=16, messages=messages, stop_sequences=[stop], **GREEDY)
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop
    assert m.content[0].text == chat_answer(chat, messages, 16, stop=[stop]).choices[0].message.content == text[:text.index(stop)]


def post(server: ServerProcess, body: dict, headers: dict | None = None, path: str = "/v1/messages") -> httpx.Response:
    return httpx.post(server.url + path, json=body, headers={"x-api-key": KEYED_API_KEY} if headers is None else headers, timeout=60)


BASE = {"model": MODEL, "max_tokens": 4}


@pytest.mark.parametrize("body,status,kind,field", [
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}, 400, "invalid_request_error", "max_tokens"),
    ({**BASE, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, 400, "invalid_request_error",
     "messages[0].content[0].type"),
    ({**BASE, "messages": [{"role": "user", "content": [{"type": "bogus"}]}]}, 400, "invalid_request_error",
     "messages[0].content[0].type"),
    ({**BASE, "messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]}, 400,
     "invalid_request_error", "messages[0]"),
    ({**BASE, "messages": [{"role": "user", "content": [{"type": "tool_result"}]}]}, 400, "invalid_request_error",
     "messages[0].content[0]"),
    ({**BASE, "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "web_search_20250305", "name": "w"}]}, 400,
     "invalid_request_error", "tools[0].type"),
    ({**BASE, "messages": [{"role": "user", "content": "x" * 40_000}]}, 400, "invalid_request_error", "messages"),
    ({**BASE, "messages": [{"role": "user", "content": "word " * 600}]}, 400, "invalid_request_error", "messages"),
    ({**BASE, "model": "claude-sonnet", "messages": [{"role": "user", "content": "hi"}]}, 404, "not_found_error", "model"),
])
def test_bad_input_is_an_anthropic_error(keyed_server: ServerProcess, body: dict, status: int, kind: str,
                                         field: str) -> None:
    r = post(keyed_server, body)
    assert r.status_code == status, r.text
    assert r.json() == {"type": "error", "error": {"type": kind, "message": r.json()["error"]["message"]}}
    assert field in r.json()["error"]["message"] and "Traceback" not in r.text, r.text  # the message names the field


def test_the_key_is_taken_as_x_api_key_or_bearer(keyed_server: ServerProcess) -> None:
    body = {**BASE, "messages": [{"role": "user", "content": "hi"}]}
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        for headers in ({}, {"x-api-key": "wrong"}, {"Authorization": "Bearer wrong"}):
            r = post(keyed_server, body, headers, path)
            assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error", (path, r.text)
    assert post(keyed_server, body, {"Authorization": f"Bearer {KEYED_API_KEY}"}).json()["type"] == "message"


def test_max_tokens_beyond_the_context_is_lowered_to_it(keyed_server: ServerProcess) -> None:
    """Claude Code asks 32,000 tokens of every request: a cap the context lowers, as Anthropic's API
    does, and an answer the context ended says so (the keyed server's context is 512 tokens)."""
    body = {"model": MODEL, "max_tokens": 32_000, "messages": [{"role": "user", "content": "Tell me a story."}],
            "temperature": 0.0}
    m = post(keyed_server, body).json()
    usage = m["usage"]
    prompt = usage["input_tokens"] + usage["cache_creation_input_tokens"] + usage["cache_read_input_tokens"]
    assert m["stop_reason"] == "model_context_window_exceeded" and prompt + usage["output_tokens"] == 512, m
    assert post(keyed_server, {**body, "max_tokens": 3}).json()["stop_reason"] == "max_tokens"
