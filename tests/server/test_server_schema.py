"""Request schemas: strict types and exact bounds, errors as OpenAI objects naming the field,
unknown fields ignored with a warning, one path to ``SamplingParams``, and ``/openapi.json``."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from server.api.parsing import parse_body
from server.api.schema_base import SEED_MAX, SEED_MIN
from server.http.errors import APIError
from server.openai.schemas.chat import ChatCompletionRequest, template_messages
from server.openai.schemas.completions import CompletionRequest
from server.routes.openapi_document import REF, openapi_document
from tests.helpers.servers import ServerProcess

P = {"prompt": "Hello"}
M = {"messages": [{"role": "user", "content": "Hello"}]}


def refusal(schema: type, body: dict | bytes) -> APIError:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    with pytest.raises(APIError) as exc:
        parse_body(schema, raw)
    assert exc.value.status == 400 and exc.value.type == "invalid_request_error"
    return exc.value


# (schema, body, param, words the message must contain)
REFUSED = [
    (CompletionRequest, {**P, "max_tokens": "5"}, "max_tokens", ["must be an integer", 'string "5"']),
    (CompletionRequest, {**P, "max_tokens": 5.0}, "max_tokens", ["must be an integer"]),
    (CompletionRequest, {**P, "max_tokens": True}, "max_tokens", ["must be an integer", "boolean"]),
    (CompletionRequest, {**P, "max_tokens": 0}, "max_tokens", ["must be >= 1, got 0", "'echo': true"]),
    (CompletionRequest, {**P, "n": 2**64}, "n", ["must be <= 128", str(2**64)]),
    (CompletionRequest, {**P, "seed": SEED_MAX + 1}, "seed", [f"must be <= {SEED_MAX}"]),
    (CompletionRequest, {**P, "seed": SEED_MIN - 1}, "seed", [f"must be >= {SEED_MIN}"]),
    (CompletionRequest, b'{"prompt": "x", "max_tokens": ' + b"9" * 4300 + b"}", "max_tokens", ["must be <= 922337"]),
    (CompletionRequest, b'{"prompt": "x", "temperature": ' + b"9" * 400 + b"}", "temperature", ["out of range"]),
    (CompletionRequest, b'{"prompt": "x", "temperature": NaN}', "temperature", ["finite number"]),
    (CompletionRequest, b'{"prompt": "x", "top_p": 1e999}', "top_p", ["finite number"]),
    (CompletionRequest, {**P, "stream": 1}, "stream", ["must be a boolean"]),
    (CompletionRequest, {**P, "echo": "true"}, "echo", ["must be a boolean"]),
    (CompletionRequest, {**P, "stop_token_ids": [1, -1]}, "stop_token_ids[1]", [">= 0"]),
    (CompletionRequest, {**P, "stream": True, "stream_options": {"include_usage": 1}}, "stream_options.include_usage", ["boolean"]),
    (ChatCompletionRequest, {"messages": [{"role": {}, "content": "hi"}]}, "messages[0].role", ["must be one of", "{}"]),
    (ChatCompletionRequest, {"messages": [{"role": ["user"], "content": "hi"}]}, "messages[0].role", ["must be one of"]),
    (ChatCompletionRequest, {"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]},
     "messages[0].content[0].text", ["string"]),
    (ChatCompletionRequest, {"messages": [{"role": "user", "content": "x", "name": 3}]}, "messages[0].name", ["string"]),
    (ChatCompletionRequest, {"messages": [{"role": "user", "content": None}]}, "messages[0].content", ["required"]),
    (ChatCompletionRequest, {"messages": {"role": "user"}}, "messages", ["must be an array", "object"]),
    (ChatCompletionRequest, {**M, "logprobs": 1}, "logprobs", ["must be a boolean"]),
    (ChatCompletionRequest, {**M, "max_tokens": 3, "max_completion_tokens": 4}, "max_completion_tokens", ["max_tokens"]),
    (ChatCompletionRequest, {**M, "tool_choice": {"type": "function"}}, "tool_choice", ['must be "none"', '"function"']),
    (ChatCompletionRequest, {**M, "tool_choice": "always"}, "tool_choice", ['"required"']),
    (ChatCompletionRequest, {**M, "messages": [{"role": "tool", "content": "x"}]}, "messages[0]", ["'tool_call_id' is required"]),
    (ChatCompletionRequest, {**M, "messages": [{"role": "function", "content": "x"}]}, "messages[0].role", ["not supported"]),
    (ChatCompletionRequest, {**M, "logit_bias": {"x1": 1}}, "logit_bias", ["decimal strings", "x1"]),
]


@pytest.mark.parametrize("schema,body,param,words", REFUSED, ids=[f"{c[2]}-{i}" for i, c in enumerate(REFUSED)])
def test_refused_with_param_and_clear_message(schema, body, param, words) -> None:
    err = refusal(schema, body)
    assert err.param == param
    assert err.message.startswith(f"'{param}' ")
    for word in words:
        assert word in err.message


def test_body_level_errors_have_no_param() -> None:
    for raw, words in [(b"[]", "must be a JSON object, got array"), (b'{"a":', "not valid JSON"), (b"  ", "empty")]:
        err = refusal(CompletionRequest, raw)
        assert err.param is None and words in err.message


def test_long_values_are_cut_short_in_messages() -> None:
    err = refusal(CompletionRequest, {**P, "max_tokens": "x" * 10_000})
    assert len(err.message) < 200


def test_nulls_mean_not_given() -> None:
    nulls = {name: None for name in CompletionRequest.model_fields if name != "prompt"}
    assert parse_body(CompletionRequest, json.dumps({**P, **nulls}).encode()) == parse_body(CompletionRequest, b'{"prompt": "Hello"}')


def test_unknown_fields_are_kept_aside_with_their_paths() -> None:
    body = {
        **M, "temprature": 0.5, "stream": True, "stream_options": {"include_usage": True, "chunk": 1},
        "messages": [{"role": "user", "content": [{"type": "text", "text": "a", "cache": 1}], "extra": 2}],
    }
    req = parse_body(ChatCompletionRequest, json.dumps(body).encode())
    assert sorted(req.unknown_fields()) == sorted(
        ["temprature", "stream_options.chunk", "messages[0].extra", "messages[0].content[0].cache"]
    )
    assert req.temperature == 1.0 and req.include_usage


def test_sampling_params_per_choice() -> None:
    req = parse_body(
        CompletionRequest,
        json.dumps({**P, "seed": SEED_MAX, "top_k": -1, "speculative": False, "stop": "x", "logprobs": 2}).encode(),
    )
    first, second = (req.to_sampling_params(7, choice) for choice in (0, 1))
    assert first.seed == SEED_MAX and second.seed == SEED_MIN  # seed + choice, wrapping within int64
    assert first.max_tokens == 7 and first.top_k == 0 and first.num_speculative_tokens == 0
    assert first.stop == ["x"] and first.logprobs == 2
    chat = parse_body(ChatCompletionRequest, json.dumps({**M, "logprobs": True, "max_completion_tokens": 5}).encode())
    params = chat.to_sampling_params(chat.completion_budget, 0)
    assert params.logprobs == 0 and params.seed is None and params.num_speculative_tokens is None
    assert chat.budget_param == "max_completion_tokens"


def test_chat_content_parts_are_joined_and_developer_is_system() -> None:
    body = {"messages": [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], "name": "x"},
    ]}
    req = parse_body(ChatCompletionRequest, json.dumps(body).encode())
    assert template_messages(req.messages) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "ab", "name": "x"},
    ]


def test_openapi_document_is_generated_from_the_schemas() -> None:
    doc = openapi_document()
    assert doc["openapi"].startswith("3.1")
    assert {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health"} <= set(doc["paths"])
    schemas = doc["components"]["schemas"]
    for path, model in [("/v1/completions", CompletionRequest), ("/v1/chat/completions", ChatCompletionRequest)]:
        body = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert body == {"$ref": REF.format(model=model.__name__)}
        generated = model.model_json_schema(ref_template=REF)
        generated.pop("$defs", None)
        assert schemas[model.__name__] == generated
    # The document is valid JSON Schema (2020-12, as OpenAPI 3.1 uses) and agrees with validation.
    resolver_doc = {"$ref": REF.format(model="ChatCompletionRequest"), "components": doc["components"]}
    jsonschema.Draft202012Validator.check_schema(resolver_doc)
    validator = jsonschema.Draft202012Validator(resolver_doc)
    assert validator.is_valid({**M, "temperature": None, "stop": "x"})
    assert not validator.is_valid({**M, "max_tokens": 0})


def test_openapi_json_is_served(tiny_server: ServerProcess) -> None:
    r = httpx.get(tiny_server.url + "/openapi.json", timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    assert r.json() == json.loads(json.dumps(openapi_document()))


def test_unknown_fields_are_ignored_with_a_warning(tiny_server: ServerProcess) -> None:
    body = {"model": "tiny", "prompt": "Hello", "max_tokens": 2, "temprature": 0.5, "stream_options_x": 1}
    r = httpx.post(tiny_server.url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    request_id = r.headers["x-request-id"]
    # Logged while the request was handled, so already in the log once the response is here.
    lines = [line for line in tiny_server.logs().splitlines() if request_id in line and "ignoring unknown" in line]
    assert len(lines) == 1, tiny_server.logs()[-3000:]
    assert "temprature" in lines[0] and "stream_options_x" in lines[0]
