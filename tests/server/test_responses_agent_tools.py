"""The Responses API's tools beyond functions, as Codex CLI sends them, through the real server:
``namespace`` tools called and routed back split (``namespace`` and ``name``), ``custom`` tools
whose calls come back as ``custom_tool_call`` items (streamed with their ``*.done`` events), hosted
tools left out, past custom calls and namespaced calls rendering the prompt chat renders for the
same conversation; the response object has every field the Open Responses spec requires, and
``/v1/responses/input_tokens`` counts the prompt.

The required fields are those of the Open Responses compliance suite's response schema
(openresponses/openresponses, ``src/lib/compliance-tests.ts`` with ``responseResourceSchema``):
the response object, its output items and ``usage``. The suite's text, streaming, system-prompt,
multi-turn and tool-calling cases are sent here as the suite sends them."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.helpers.servers import KEYED_API_KEY, ServerProcess, parse_named_sse

MODEL = "tiny"
GREEDY = {"temperature": 0.0}
LOOKUP = {"type": "object", "properties": {"order_id": {"type": "string", "enum": ["7", "8"]}}, "required": ["order_id"],
          "additionalProperties": False}
NAMESPACE = {"type": "namespace", "name": "mcp__shop__", "description": "Shop tools",
             "tools": [{"type": "function", "name": "lookup_order", "description": "Find an order", "parameters": LOOKUP}]}
PATCH_GRAMMAR = 'start: "*** Begin Patch\\n" LINE* "*** End Patch"\nLINE: /[^\\n]*\\n/'
APPLY_PATCH = {"type": "custom", "name": "apply_patch", "description": "Edit files",
               "format": {"type": "grammar", "syntax": "lark", "definition": PATCH_GRAMMAR}}
HOSTED = [{"type": "web_search", "external_web_access": False}, {"type": "image_generation"}]

# Open Responses' responseResourceSchema: every key required (null where nullable)
RESPONSE_FIELDS = {
    "id", "object", "created_at", "completed_at", "status", "incomplete_details", "model", "previous_response_id",
    "instructions", "output", "error", "tools", "tool_choice", "truncation", "parallel_tool_calls", "text", "top_p",
    "presence_penalty", "frequency_penalty", "top_logprobs", "temperature", "reasoning", "usage", "max_output_tokens",
    "max_tool_calls", "store", "background", "service_tier", "metadata", "safety_identifier", "prompt_cache_key",
}
NUMBERS = ("top_p", "presence_penalty", "frequency_penalty", "temperature")


@pytest.fixture(scope="module")
def client(keyed_server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=keyed_server.url + "/v1", api_key=KEYED_API_KEY, max_retries=0, timeout=120)


def post(server: ServerProcess, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json=body, headers={"Authorization": f"Bearer {KEYED_API_KEY}"}, timeout=120)


def check_response_object(body: dict) -> None:
    """The Open Responses schema's checks of a response object (see module docstring)."""
    assert RESPONSE_FIELDS <= body.keys(), RESPONSE_FIELDS - body.keys()
    assert isinstance(body["created_at"], int) and isinstance(body["top_logprobs"], int)
    assert all(isinstance(body[name], (int, float)) and not isinstance(body[name], bool) for name in NUMBERS)
    assert body["truncation"] in ("auto", "disabled") and isinstance(body["service_tier"], str)
    assert set(body["reasoning"]) == {"effort", "summary"}
    for tool in body["tools"]:
        assert tool["type"] != "function" or {"name", "description", "parameters", "strict"} <= tool.keys()
    usage = body["usage"]
    assert usage is None or (usage["input_tokens_details"].keys() >= {"cached_tokens"}
                             and usage["output_tokens_details"].keys() >= {"reasoning_tokens"})
    for item in body["output"]:
        assert {"id", "type", "status"} <= item.keys()
        if item["type"] == "message":
            assert all({"type", "text", "annotations", "logprobs"} <= part.keys() for part in item["content"])


@pytest.mark.parametrize("case", [
    # the suite's cases: basic, system prompt, multi-turn (assistant content as a plain string)
    {"input": [{"type": "message", "role": "user", "content": "Say hello in exactly 3 words."}]},
    {"input": [{"type": "message", "role": "system", "content": "You are a pirate. Always respond in pirate speak."},
               {"type": "message", "role": "user", "content": "Say hello."}]},
    {"input": [{"type": "message", "role": "user", "content": "My name is Alice."},
               {"type": "message", "role": "assistant", "content": "Hello Alice! Nice to meet you."},
               {"type": "message", "role": "user", "content": "What is my name?"}]},
])
def test_open_responses_text_cases(keyed_server: ServerProcess, case: dict) -> None:
    r = post(keyed_server, "/v1/responses", {"model": MODEL, "stream": False, "max_output_tokens": 8, **case})
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json"), r.text
    body = r.json()
    check_response_object(body)
    assert body["output"] and body["output"][0]["type"] == "message"


def test_open_responses_streaming_and_tool_calling(keyed_server: ServerProcess) -> None:
    body = {"model": MODEL, "input": [{"type": "message", "role": "user", "content": "Count from 1 to 5."}],
            "stream": True, "max_output_tokens": 8}
    with httpx.stream("POST", keyed_server.url + "/v1/responses", json=body, timeout=120,
                      headers={"Authorization": f"Bearer {KEYED_API_KEY}"}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    assert "\r\n" not in raw  # the suite's parser fires on LF blank lines only
    events = parse_named_sse(raw)
    assert all(isinstance(e["sequence_number"], int) for e in events)
    for e in events:
        if "response" in e:
            check_response_object(e["response"])
    tools = [{"type": "function", "name": "get_weather", "description": "Get the current weather for a location",
              "parameters": {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]}}]
    called = post(keyed_server, "/v1/responses", {"model": MODEL, "input": "What's the weather like in San Francisco?",
                                                  "tools": tools, "tool_choice": "required", "max_output_tokens": 64})
    check_response_object(called.json())
    assert [item["type"] for item in called.json()["output"]] == ["function_call"]


def test_namespaced_call_comes_back_split_and_renders_as_chat(client: openai.OpenAI, keyed_server: ServerProcess) -> None:
    ask = [{"role": "user", "content": "Where is order 7?"}]
    r = post(keyed_server, "/v1/responses", {
        "model": MODEL, "input": ask, "tools": [NAMESPACE, *HOSTED], "max_output_tokens": 64, **GREEDY,
        "tool_choice": {"type": "function", "name": "mcp__shop__lookup_order"}}).json()
    check_response_object(r)
    [call] = r["output"]
    assert (call["type"], call["namespace"], call["name"]) == ("function_call", "mcp__shop__", "lookup_order")
    assert json.loads(call["arguments"])["order_id"] in ("7", "8")
    assert [t["type"] for t in r["tools"]] == ["namespace"]  # the hosted ones were left out
    # The call sent back with its namespace renders what chat renders for the joined function name.
    result = {"type": "function_call_output", "call_id": call["call_id"], "output": "shipped"}
    turn = post(keyed_server, "/v1/responses", {"model": MODEL, "input": [*ask, call, result], "tools": [NAMESPACE],
                                                "max_output_tokens": 6, **GREEDY}).json()
    chat_tools = [{"type": "function", "function": {"name": "mcp__shop__lookup_order", "description": "Find an order",
                                                    "parameters": LOOKUP}}]
    chat_call = {"id": call["call_id"], "type": "function",
                 "function": {"name": "mcp__shop__lookup_order", "arguments": call["arguments"]}}
    same = client.chat.completions.create(model=MODEL, max_tokens=6, tools=chat_tools, temperature=0.0, messages=[
        *ask, {"role": "assistant", "content": "", "tool_calls": [chat_call]},
        {"role": "tool", "tool_call_id": call["call_id"], "content": "shipped"}])
    assert turn["usage"]["input_tokens"] == same.usage.prompt_tokens
    text = "".join(part["text"] for item in turn["output"] if item["type"] == "message" for part in item["content"])
    assert text == (same.choices[0].message.content or "")


def test_custom_tool_call_streams_whole_and_goes_back(keyed_server: ServerProcess) -> None:
    body = {"model": MODEL, "input": "Fix the typo.", "tools": [APPLY_PATCH], "max_output_tokens": 96, "stream": True,
            "tool_choice": {"type": "custom", "name": "apply_patch"}, **GREEDY}
    with httpx.stream("POST", keyed_server.url + "/v1/responses", json=body, timeout=120,
                      headers={"Authorization": f"Bearer {KEYED_API_KEY}"}) as r:
        events = parse_named_sse(r.read().decode())
    kinds = [e["type"] for e in events]
    assert "response.function_call_arguments.delta" not in kinds
    start = kinds.index("response.output_item.added")
    # the random model may write the free input until max_output_tokens: then the response is incomplete
    assert kinds[start + 1:-1] == ["response.custom_tool_call_input.delta", "response.custom_tool_call_input.done",
                                   "response.output_item.done"], kinds
    assert kinds[-1] in ("response.completed", "response.incomplete")
    added, done, final = events[start]["item"], events[-2]["item"], events[-1]["response"]
    assert added["type"] == done["type"] == "custom_tool_call" and added["id"] == done["id"] == final["output"][0]["id"]
    assert added["call_id"] == done["call_id"] and done["name"] == "apply_patch"
    assert isinstance(done["input"], str) and done["input"] == events[start + 2]["input"] == final["output"][0]["input"]
    # the call and its output go back as Codex sends them
    turn = post(keyed_server, "/v1/responses", {
        "model": MODEL, "tools": [APPLY_PATCH], "max_output_tokens": 4, "store": False,
        "input": [{"type": "message", "role": "user", "content": "Fix the typo.", "id": "msg_1"}, {**done, "id": "ctc_1"},
                  {"type": "custom_tool_call_output", "call_id": done["call_id"], "output": "Done!", "id": "ctco_1"},
                  {"type": "reasoning", "summary": [], "encrypted_content": None}]})
    assert turn.status_code == 200, turn.text


def test_input_tokens_counts_the_prompt(keyed_server: ServerProcess) -> None:
    body = {"model": MODEL, "instructions": "Be brief.", "input": "Name a colour.", "tools": [NAMESPACE, APPLY_PATCH],
            "max_output_tokens": 2}
    counted = post(keyed_server, "/v1/responses/input_tokens", body)
    assert counted.status_code == 200 and counted.json()["object"] == "response.input_tokens"
    assert counted.json()["input_tokens"] == post(keyed_server, "/v1/responses", body).json()["usage"]["input_tokens"]
    compact = post(keyed_server, "/v1/responses/compact", {"model": MODEL, "input": "hi"})
    assert compact.status_code == 404 and compact.json()["error"]["code"] == "not_supported"


def test_models_list_carries_the_context_and_codex_model_info(keyed_server: ServerProcess) -> None:
    listed = httpx.get(keyed_server.url + "/v1/models", headers={"Authorization": f"Bearer {KEYED_API_KEY}"}).json()
    [card], [info] = listed["data"], listed["models"]
    assert card["id"] == info["slug"] == MODEL and card["max_model_len"] == info["context_window"] == 512
    # the fields Codex's ModelInfo cannot do without
    assert {"display_name", "supported_reasoning_levels", "shell_type", "visibility", "supported_in_api", "priority",
            "support_verbosity", "truncation_policy", "experimental_supported_tools"} <= info.keys()
