"""``/v1/responses`` (OpenAI's Responses API) through a real ``specdec serve`` of the tiny draft pair,
driven by the real openai SDK and the OpenAI Agents SDK: greedy output equal to chat's for the same
messages and to speculation off, streams that the SDK's helpers reassemble into the whole answer,
a function-call round trip, ``previous_response_id`` continuing the stored conversation (served
mostly from the prefix cache), ``parse`` with a pydantic model, bad input as OpenAI error objects,
and the stored responses: behind the API key, unguessable ids, a full store evicting.

One server for this module and test_messages_api.py (``keyed_server``, tests/server/conftest.py):
started with an API key and a store of ``KEYED_STORE_ENTRIES`` responses, so the key and eviction
are the real server's."""

from __future__ import annotations

import asyncio
import json
from typing import Literal

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel

from tests.helpers.servers import KEYED_API_KEY, KEYED_STORE_ENTRIES, ServerProcess
from tests.helpers.tool_data import CITY_TIME

MODEL = "tiny"
TOOLS = [{"type": "function", "name": "get_time", "description": "Time in a city", "parameters": CITY_TIME, "strict": True}]
GET_TIME = {"type": "function", "name": "get_time"}
GREEDY = {"temperature": 0.0}


class Weather(BaseModel):
    """Finite by construction, so even a random model completes it."""

    sky: Literal["clear", "cloudy", "rain"]
    windy: bool


@pytest.fixture(scope="module")
def client(keyed_server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=keyed_server.url + "/v1", api_key=KEYED_API_KEY, max_retries=0, timeout=120)


def chat_text(client: openai.OpenAI, messages: list[dict], max_tokens: int, **extra: object) -> tuple[str, str]:
    out = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=max_tokens, temperature=0.0, **extra)
    return out.choices[0].message.content or "", out.choices[0].finish_reason


def test_text_equals_chat_and_speculation_off(client: openai.OpenAI) -> None:
    r = client.responses.create(model=MODEL, instructions="Be brief.", input="Tell me about the sea.", max_output_tokens=12,
                                **GREEDY)
    assert r.id.startswith("resp_") and len(r.id) - len("resp_") >= 32  # >= 128 random bits, in hex
    text, finish = chat_text(client, [{"role": "system", "content": "Be brief."},
                                      {"role": "user", "content": "Tell me about the sea."}], 12)
    assert r.output_text == text and r.output[0].type == "message" and r.output[0].role == "assistant"
    off = client.responses.create(model=MODEL, instructions="Be brief.", input="Tell me about the sea.",
                                  max_output_tokens=12, extra_body={"speculative": False}, **GREEDY)
    assert off.output_text == text
    assert r.model_extra["speculative"]["method"] != "none" and off.model_extra["speculative"]["method"] == "none"
    assert r.usage.output_tokens == 12 and r.usage.total_tokens == r.usage.input_tokens + 12
    # the random model does not stop by itself: the budget ends it, as OpenAI reports that
    assert finish == "length" and r.status == "incomplete"
    assert r.incomplete_details.reason == "max_output_tokens" and r.output[0].status == "incomplete"


def test_stream_events_reassemble_the_whole_answer(client: openai.OpenAI) -> None:
    kwargs = dict(model=MODEL, input=[{"role": "user", "content": "Count to ten."}], max_output_tokens=10, **GREEDY)
    whole = client.responses.create(**kwargs)
    events = list(client.responses.create(stream=True, **kwargs))
    kinds = [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) > 1 and "".join(deltas) == whole.output_text
    final = events[-1].response
    assert final.output_text == whole.output_text and final.usage.output_tokens == 10
    assert final.incomplete_details.reason == "max_output_tokens" and final.id == events[0].response.id


def test_function_call_round_trip_streamed_and_continued(client: openai.OpenAI) -> None:
    ask = [{"role": "user", "content": "What time is it in Paris?"}]
    with client.responses.stream(model=MODEL, input=ask, tools=TOOLS, tool_choice=GET_TIME, max_output_tokens=200,
                                 **GREEDY) as stream:
        pieces = [e.delta for e in stream if e.type == "response.function_call_arguments.delta"]
        r = stream.get_final_response()
    assert r.status == "completed" and [o.type for o in r.output] == ["function_call"]
    call = r.output[0]
    assert call.name == "get_time" and call.call_id and call.status == "completed"
    assert len(pieces) > 1 and "".join(pieces) == call.arguments
    jsonschema.validate(json.loads(call.arguments), CITY_TIME)
    # The tool's answer goes back by previous_response_id, or with the whole conversation: the same
    # turn, and the one chat gives for the same conversation.
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "12:00"}
    by_id = client.responses.create(model=MODEL, previous_response_id=r.id, input=[result], tools=TOOLS,
                                    max_output_tokens=8, **GREEDY)
    resent = client.responses.create(model=MODEL, input=[*ask, call.model_dump(exclude_none=True), result], tools=TOOLS,
                                     max_output_tokens=8, **GREEDY)
    assert by_id.output_text == resent.output_text and by_id.usage.input_tokens == resent.usage.input_tokens
    chat_calls = [{"id": call.call_id, "type": "function", "function": {"name": "get_time", "arguments": call.arguments}}]
    chat_tools = [{"type": "function", "function": {"name": "get_time", "description": "Time in a city", "parameters": CITY_TIME}}]
    text, _ = chat_text(client, [*ask, {"role": "assistant", "content": None, "tool_calls": chat_calls},
                                 {"role": "tool", "tool_call_id": call.call_id, "content": "12:00"}], 8, tools=chat_tools)
    assert by_id.output_text == text


def test_previous_response_id_continues_the_stored_conversation(client: openai.OpenAI) -> None:
    first = client.responses.create(model=MODEL, instructions="Be brief.", input="Name a colour.", max_output_tokens=6,
                                    **GREEDY)
    second = client.responses.create(model=MODEL, instructions="Be brief.", previous_response_id=first.id,
                                     input="And another one?", max_output_tokens=6, **GREEDY)
    text, _ = chat_text(client, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."},
                                 {"role": "assistant", "content": first.output_text},
                                 {"role": "user", "content": "And another one?"}], 6)
    assert second.output_text == text and second.previous_response_id == first.id
    # the continued turn's prompt starts with the first turn's: the prefix cache serves it
    block = 16
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens // block * block > 0
    assert client.responses.retrieve(first.id).output_text == first.output_text
    items = client.responses.input_items.list(second.id).data
    assert [(i.type, i.role, i.content[0].text) for i in items] == [("message", "user", "And another one?")]
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError) as err:
        client.responses.create(model=MODEL, previous_response_id=first.id, input="Hi", max_output_tokens=2)
    assert err.value.body["param"] == "previous_response_id"


def test_parse_returns_the_pydantic_model_as_with_speculation_off(client: openai.OpenAI) -> None:
    kwargs = dict(model=MODEL, input="Describe the weather as JSON.", text_format=Weather, max_output_tokens=100, **GREEDY)
    parsed = client.responses.parse(**kwargs)
    assert parsed.status == "completed" and isinstance(parsed.output_parsed, Weather)
    plain = client.responses.parse(extra_body={"speculative": False}, **kwargs)
    assert plain.output_text == parsed.output_text


def test_an_agent_with_a_function_tool_runs_to_its_final_output(keyed_server: ServerProcess) -> None:
    """The Agents SDK: the first turn must call the tool (tool_choice "required"), the SDK runs it,
    sends its output back and resets the choice; the second turn answers in the agent's output type."""
    import agents

    agents.set_tracing_disabled(True)
    calls: list[str] = []

    @agents.function_tool
    def get_time(city: Literal["Paris", "Tokyo"]) -> str:
        """The time in a city."""
        calls.append(city)
        return "12:00"

    model = agents.OpenAIResponsesModel(
        model=MODEL, openai_client=openai.AsyncOpenAI(base_url=keyed_server.url + "/v1", api_key=KEYED_API_KEY, max_retries=0))
    agent = agents.Agent(name="clock", instructions="Answer with the weather.", tools=[get_time], output_type=Weather,
                         model=model, model_settings=agents.ModelSettings(tool_choice="required", max_tokens=200,
                                                                          temperature=0.0))
    result = asyncio.run(agents.Runner.run(agent, "What time is it in Paris?", max_turns=3))
    assert len(calls) == 1 and isinstance(result.final_output, Weather)
    assert [type(i).__name__ for i in result.new_items] == ["ToolCallItem", "ToolCallOutputItem", "MessageOutputItem"]


def post(server: ServerProcess, body: dict, key: str | None = KEYED_API_KEY) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(server.url + "/v1/responses", json=body, headers=headers, timeout=60)


@pytest.mark.parametrize("body,status,param,code", [
    ({"input": [{"role": "user"}]}, 400, "input[0]", "invalid_value"),
    ({"input": [{"type": "bogus"}]}, 400, "input[0].type", "invalid_value"),
    ({"input": [{"type": "computer_call_output", "call_id": "c"}]}, 400, "input[0].type", "unsupported_parameter"),
    ({"input": [{"type": "reasoning", "summary": []}]}, 400, "input", "empty_array"),  # accepted, not prompt
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}]}, 400, "input[0]", "invalid_value"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, 400,
     "input[0].content[0].type", "unsupported_parameter"),
    ({"input": 7}, 400, "input", "invalid_value"),
    ({"input": "hi", "tools": [{"type": "namespace", "name": "n", "tools": [{"type": "web_search"}]}]}, 400, "tools[0]",
     "invalid_value"),
    ({"input": "hi", "tools": [{"type": "custom", "name": "c", "format": {"type": "grammar"}}]}, 400, "tools[0].format",
     "invalid_value"),
    ({"input": "hi", "tools": [{"type": "custom", "name": "c", "parameters": {"type": "object"}}]}, 400, "tools[0]",
     "invalid_value"),
    ({"input": "hi", "truncation": "auto"}, 400, "truncation", "unsupported_parameter"),
    ({"input": "hi", "previous_response_id": "resp_" + "0" * 48}, 404, "previous_response_id", "response_not_found"),
    ({"input": "x" * 40_000}, 400, "input", "limit_exceeded"),  # over --max-prompt-chars (64 x 512)
    ({"input": "word " * 600}, 400, "input", "context_length_exceeded"),  # over --max-model-len 512
    ({"input": "hi", "max_output_tokens": 600}, 400, "max_output_tokens", "context_length_exceeded"),
    ({"input": "hi", "model": "gpt-9"}, 404, "model", "model_not_found"),
    ({"input": "hi", "tool_choice": "required"}, 400, "tool_choice", "invalid_value"),
])
def test_bad_input_is_an_openai_error(keyed_server: ServerProcess, body: dict, status: int, param: str, code: str) -> None:
    r = post(keyed_server, body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert (error["param"], error["code"]) == (param, code), error
    assert error["type"] == "invalid_request_error" and param in error["message"] and "Traceback" not in r.text


def test_stored_responses_need_the_key_and_have_unguessable_ids(keyed_server: ServerProcess, client: openai.OpenAI) -> None:
    ids = {client.responses.create(model=MODEL, input="Hi", max_output_tokens=1).id for _ in range(2)}
    assert len(ids) == 2 and all(len(i) - len("resp_") >= 32 and int(i[5:], 16) >= 0 for i in ids)
    known = ids.pop()
    for method, path in (("POST", "/v1/responses"), ("GET", f"/v1/responses/{known}"), ("DELETE", f"/v1/responses/{known}"),
                         ("GET", f"/v1/responses/{known}/input_items")):
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"x-api-key": "wrong"}):
            r = httpx.request(method, keyed_server.url + path, headers=headers, json={"input": "hi"}, timeout=30)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", (method, path, r.text)
    assert client.responses.retrieve(known).id == known  # still there: nothing above touched it


def test_a_full_store_evicts_the_least_recently_used(client: openai.OpenAI) -> None:
    made = [client.responses.create(model=MODEL, input=f"Hi {i}", max_output_tokens=1).id for i in range(KEYED_STORE_ENTRIES + 2)]
    unstored = client.responses.create(model=MODEL, input="Hi", max_output_tokens=1, store=False).id
    kept = []
    for response_id in [*made, unstored]:
        try:
            kept.append(client.responses.retrieve(response_id).id)
        except openai.NotFoundError as err:
            assert err.body["code"] == "response_not_found"
    assert kept == made[-KEYED_STORE_ENTRIES:]  # never more than the bound, the oldest gone first


def test_list_limits_and_huge_integers_are_400s_that_say_why(keyed_server: ServerProcess, client: openai.OpenAI) -> None:
    """A ``limit`` must be 1 to 100 in ASCII digits (``"²"`` passed ``isdigit`` and then failed
    ``int``: a 500); an integer in a call's arguments may have 4,300 digits, and one longer is a
    400 that says so, not Python's advice."""
    known = client.responses.create(model=MODEL, input="Hi", max_output_tokens=1).id
    url = f"{keyed_server.url}/v1/responses/{known}/input_items"
    headers = {"Authorization": f"Bearer {KEYED_API_KEY}"}
    for limit in ["²", "٣", "1" * 5000, "0", "101", "-1", "1.0", ""]:
        r = httpx.get(url, params={"limit": limit}, headers=headers, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "limit", (limit, r.text)
    assert httpx.get(url, params={"limit": "1"}, headers=headers, timeout=30).json()["data"]
    call = {"type": "function_call", "call_id": "c", "name": "f"}
    r = post(keyed_server, {"input": [{**call, "arguments": '{"n": %s}' % ("9" * 5000)}]})
    assert r.status_code == 400 and "an integer has more than 4300 digits" in r.json()["error"]["message"], r.text
    assert "sys." not in r.text
