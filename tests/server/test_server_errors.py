"""Bad input gets a 4xx OpenAI error object naming the field, never a 500 or a stack trace."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from tests.helpers.servers import TINY_MAX_MODEL_LEN, ServerProcess

C, CHAT = "/v1/completions", "/v1/chat/completions"
P = {"model": "tiny", "prompt": "Hello"}
M = {"model": "tiny", "messages": [{"role": "user", "content": "Hello"}]}
LONG_PROMPT = list(range(100, 100 + TINY_MAX_MODEL_LEN))  # token ids: exactly max_model_len of them

# (id, path, JSON body or raw bytes, status, param, code)
CASES: list[tuple[str, str, Any, int, str | None, str | None]] = [
    ("malformed-json", C, b'{"prompt": "Hello",', 400, None, "invalid_json"),
    ("empty-body", C, b"", 400, None, None),
    ("body-not-object", C, [1, 2], 400, None, "invalid_type"),
    ("temperature-low", C, {**P, "temperature": -0.1}, 400, "temperature", "decimal_below_min_value"),
    ("temperature-high", C, {**P, "temperature": 2.5}, 400, "temperature", None),
    ("temperature-type", C, {**P, "temperature": "hot"}, 400, "temperature", "invalid_type"),
    ("temperature-bool", CHAT, {**M, "temperature": True}, 400, "temperature", None),
    ("top-p-zero", C, {**P, "top_p": 0}, 400, "top_p", None),
    ("top-p-high", CHAT, {**M, "top_p": 1.5}, 400, "top_p", None),
    ("top-k-negative", C, {**P, "top_k": -2}, 400, "top_k", None),
    ("n-zero", C, {**P, "n": 0}, 400, "n", None),
    ("n-float", CHAT, {**M, "n": 1.5}, 400, "n", None),
    ("max-tokens-zero", C, {**P, "max_tokens": 0}, 400, "max_tokens", "integer_below_min_value"),
    ("max-tokens-string", C, {**P, "max_tokens": "10"}, 400, "max_tokens", None),
    ("max-tokens-float", C, {**P, "max_tokens": 5.5}, 400, "max_tokens", None),
    ("max-tokens-bool", CHAT, {**M, "max_tokens": True}, 400, "max_tokens", None),
    ("seed-beyond-int64", C, {**P, "seed": 2**64}, 400, "seed", None),
    ("max-completion-tokens-zero", CHAT, {**M, "max_completion_tokens": 0}, 400, "max_completion_tokens", None),
    ("logprobs-high", C, {**P, "logprobs": 6}, 400, "logprobs", None),
    ("chat-logprobs-type", CHAT, {**M, "logprobs": 2}, 400, "logprobs", None),
    ("top-logprobs-without-logprobs", CHAT, {**M, "top_logprobs": 2}, 400, "top_logprobs", None),
    ("presence-penalty", C, {**P, "presence_penalty": 3}, 400, "presence_penalty", None),
    ("frequency-penalty", CHAT, {**M, "frequency_penalty": -2.5}, 400, "frequency_penalty", None),
    ("seed-type", C, {**P, "seed": "abc"}, 400, "seed", None),
    ("stop-type", C, {**P, "stop": 5}, 400, "stop", None),
    ("stop-empty", C, {**P, "stop": [""]}, 400, "stop", None),
    ("stream-type", C, {**P, "stream": "yes"}, 400, "stream", None),
    ("stream-options-without-stream", C, {**P, "stream_options": {"include_usage": True}}, 400, "stream_options", None),
    ("token-id-too-large", C, {**P, "prompt": [1, 49152]}, 400, "prompt", "invalid_token_id"),
    ("token-id-negative", C, {**P, "prompt": [[1, -1]]}, 400, "prompt", "invalid_token_id"),
    ("prompt-mixed", C, {**P, "prompt": ["a", 1]}, 400, "prompt", None),
    ("prompt-empty-list", C, {**P, "prompt": []}, 400, "prompt", None),
    ("prompt-empty-string", C, {**P, "prompt": ""}, 400, "prompt", None),
    ("prompt-missing", C, {"model": "tiny"}, 400, "prompt", None),
    ("messages-missing", CHAT, {"model": "tiny"}, 400, "messages", "missing_required_parameter"),
    ("messages-empty", CHAT, {**M, "messages": []}, 400, "messages", "empty_array"),
    ("message-role", CHAT, {**M, "messages": [{"role": "robot", "content": "x"}]}, 400, "messages[0].role", "invalid_value"),
    # An unhashable role once escaped validation as a TypeError (500).
    ("message-role-object", CHAT, {**M, "messages": [{"role": {}, "content": "hi"}]}, 400, "messages[0].role", None),
    ("message-not-object", CHAT, {**M, "messages": ["hi"]}, 400, "messages[0]", None),
    ("message-content-type", CHAT, {**M, "messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content", None),
    (
        "message-image-part",
        CHAT,
        {**M, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
        400,
        "messages[0].content[0].type",
        "unsupported_parameter",
    ),
    ("context-overflow", C, {**P, "max_tokens": TINY_MAX_MODEL_LEN}, 400, "max_tokens", "context_length_exceeded"),
    (
        "chat-context-overflow",
        CHAT,
        {**M, "max_completion_tokens": TINY_MAX_MODEL_LEN},
        400,
        "max_completion_tokens",
        "context_length_exceeded",
    ),
    ("prompt-too-long", C, {**P, "prompt": LONG_PROMPT, "max_tokens": 1}, 400, "prompt", "context_length_exceeded"),
    ("unknown-model", C, {**P, "model": "gpt-4"}, 404, "model", "model_not_found"),
    ("unknown-model-chat", CHAT, {**M, "model": "gpt-4"}, 404, "model", "model_not_found"),
    ("suffix", C, {**P, "suffix": "end"}, 400, "suffix", "unsupported_parameter"),
    ("best-of", C, {**P, "best_of": 3}, 400, "best_of", "unsupported_parameter"),
    ("logit-bias-out-of-vocab", C, {**P, "logit_bias": {"9999999": -100}}, 400, "logit_bias", "invalid_token_id"),
    ("stop-token-id-out-of-vocab", C, {**P, "stop_token_ids": [10**12], "min_tokens": 1, "max_tokens": 2}, 400,
     "stop_token_ids", "invalid_token_id"),
    ("stop-token-id-vocab-size", CHAT, {**M, "stop_token_ids": [5, 49152], "min_tokens": 1, "max_tokens": 2}, 400,
     "stop_token_ids", "invalid_token_id"),
    ("stop-token-id-unbanned", C, {**P, "stop_token_ids": [49152], "max_tokens": 2}, 400,
     "stop_token_ids", "invalid_token_id"),
    ("logit-bias-key", C, {**P, "logit_bias": {"the": -100}}, 400, "logit_bias", None),
    ("logit-bias-range", CHAT, {**M, "logit_bias": {"5": 101}}, 400, "logit_bias.5", None),
    ("min-tokens-over-budget", C, {**P, "max_tokens": 4, "min_tokens": 5}, 400, "min_tokens", None),
    ("legacy-functions", CHAT, {**M, "functions": [{"name": "f"}]}, 400, "functions", "unsupported_parameter"),
    (
        "response-format-uncompilable-schema",
        CHAT,
        {**M, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strang"}}}},
        400,
        "response_format",
        "invalid_response_format",
    ),
    (
        "response-format-bad-pattern",
        C,
        {**P, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "(a"}}}},
        400,
        "response_format",
        "invalid_response_format",
    ),
    *[(f"response-format-{name}", CHAT, {**M, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": schema}}}, 400, "response_format.json_schema.schema", None) for name, schema in [
        ("5001-properties", {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(5001)}}),
        ("1001-enum-values", {"enum": list(range(1001))}),
        ("120001-characters", {"type": "string", "description": "d" * 120_000}),
    ]],
    ("response-format-no-schema", CHAT, {**M, "response_format": {"type": "json_schema"}}, 400, "response_format", None),
    ("response-format-type", CHAT, {**M, "response_format": {"type": "yaml"}}, 400, "response_format.type", None),
    # OpenAI refuses these rather than ignoring them (issue 22, finding 9)
    ("tools-empty", CHAT, {**M, "tools": []}, 400, "tools", "empty_array"),
    ("tool-choice-without-tools", CHAT, {**M, "tool_choice": "none"}, 400, "tool_choice", "invalid_value"),
    ("tool-choice-auto-without-tools", CHAT, {**M, "tool_choice": "auto", "tools": []}, 400, "tools", "empty_array"),
    ("parallel-tool-calls-without-tools", CHAT, {**M, "parallel_tool_calls": False}, 400, "parallel_tool_calls",
     "invalid_value"),
    ("echo-with-logprobs-streamed", C, {**P, "echo": True, "logprobs": 1, "stream": True}, 400, "logprobs", None),
    ("prompt-logprobs-streamed", CHAT, {**M, "prompt_logprobs": 1, "stream": True}, 400, "prompt_logprobs", None),
    ("prompt-logprobs-too-many", CHAT, {**M, "prompt_logprobs": 21}, 400, "prompt_logprobs", None),
    ("speculative-contradiction", C, {**P, "speculative": False, "num_speculative_tokens": 3}, 400, "num_speculative_tokens", None),
    ("num-speculative-negative", C, {**P, "num_speculative_tokens": -1}, 400, "num_speculative_tokens", None),
    ("speculative-type", CHAT, {**M, "speculative": "off"}, 400, "speculative", None),
    ("cache-salt-empty", C, {**P, "cache_salt": ""}, 400, "cache_salt", None),
    ("cache-salt-too-long", CHAT, {**M, "cache_salt": "s" * 1025}, 400, "cache_salt", None),
    ("cache-salt-type", CHAT, {**M, "cache_salt": 7}, 400, "cache_salt", None),
]


@pytest.fixture(scope="module")
def http(tiny_server: ServerProcess):
    with httpx.Client(base_url=tiny_server.url, timeout=30) as c:
        yield c


def assert_error_object(r: httpx.Response, status: int, param: str | None, code: str | None = None) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert set(body) == {"error"}
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    assert "Traceback" not in err["message"] and 'File "' not in err["message"]
    assert err["param"] == param
    if code is not None:
        assert err["code"] == code
    if status == 400:  # never null: clients branch on it (OpenAI's codes)
        assert isinstance(err["code"], str) and err["code"], err
    return err


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input(http: httpx.Client, case: tuple) -> None:
    _, path, body, status, param, code = case
    if isinstance(body, bytes):
        r = http.post(path, content=body, headers={"content-type": "application/json"})
    else:
        r = http.post(path, json=body)
    err = assert_error_object(r, status, param, code)
    assert err["type"] == "invalid_request_error"


def test_context_message_is_openai_style(http: httpx.Client) -> None:
    r = http.post(C, json={**P, "max_tokens": TINY_MAX_MODEL_LEN})
    assert "maximum context length is 512 tokens" in r.json()["error"]["message"]


def test_unknown_route_and_method(http: httpx.Client) -> None:
    assert_error_object(http.get("/v1/nothing"), 404, None)
    assert_error_object(http.get(C), 405, None)


def test_sdk_raises_typed_errors(tiny_server: ServerProcess) -> None:
    client = openai.OpenAI(base_url=tiny_server.url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(model="tiny", prompt="Hi", temperature=3)
    assert exc.value.body["param"] == "temperature"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])


def test_no_server_errors_after_bad_inputs(http: httpx.Client) -> None:
    """After all of the above the server is healthy and never answered 5xx."""
    for case in CASES:
        _, path, body, *_ = case
        if isinstance(body, bytes):
            http.post(path, content=body)
        else:
            http.post(path, json=body)
    assert http.get("/health").status_code == 200
    text = http.get("/metrics").text
    assert "status=\"500\"" not in text
    ok = http.post(C, json={**P, "max_tokens": 2})
    assert ok.status_code == 200
