"""The OpenAI API of a real ``specdec serve`` process (tiny random models, draft speculation),
driven by the openai SDK, raw httpx for SSE framing, and ``curl -N``."""

from __future__ import annotations

import json
import shutil
import subprocess

import httpx
import openai
import pytest

from tests.helpers.servers import ServerProcess, metric_value, parse_sse

MODEL = "tiny"
PROMPT = "The quick brown fox"
MESSAGES = [{"role": "user", "content": "Tell me a story about a fox."}]
SPEC_KEYS = {"method", "draft_tokens", "accepted_tokens", "steps", "acceptance_rate", "mean_accepted_length"}


@pytest.fixture(scope="module")
def client(tiny_server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=tiny_server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def http(tiny_server: ServerProcess):
    with httpx.Client(base_url=tiny_server.url, timeout=60) as c:
        yield c


def completion_text(http: httpx.Client, **body) -> dict:
    r = http.post("/v1/completions", json={"model": MODEL, **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_health_and_models(client: openai.OpenAI, http: httpx.Client) -> None:
    r = http.get("/health")
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL]
    assert models[0].owned_by == "specdec" and isinstance(models[0].created, int)
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")


def test_completion_shape(http: httpx.Client) -> None:
    body = completion_text(http, prompt=PROMPT, max_tokens=8, temperature=0)
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    assert body["model"] == MODEL and isinstance(body["created"], int)
    (choice,) = body["choices"]
    assert choice["index"] == 0 and choice["logprobs"] is None
    assert choice["finish_reason"] in ("stop", "length") and isinstance(choice["text"], str)
    usage = body["usage"]
    assert usage["prompt_tokens"] > 0 and 0 < usage["completion_tokens"] <= 8
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    spec = body["speculative"]
    assert set(spec) == SPEC_KEYS and spec["method"] == "auto"
    assert spec["steps"] >= 1 and 0 <= spec["accepted_tokens"] <= spec["draft_tokens"]
    assert 0.0 <= spec["acceptance_rate"] <= 1.0 and spec["mean_accepted_length"] >= 1.0


def test_default_max_tokens_is_16(http: httpx.Client) -> None:
    body = completion_text(http, prompt=PROMPT, temperature=0, ignore_eos=True)
    assert body["usage"]["completion_tokens"] == 16 and body["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_streamed_text_equals_non_streamed(client: openai.OpenAI, endpoint: str) -> None:
    if endpoint == "completions":
        full = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0)
        stream = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0, stream=True)
        chunks = list(stream)
        streamed = "".join(c.choices[0].text for c in chunks if c.choices)
        expected = full.choices[0].text
    else:
        full = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=24, temperature=0)
        stream = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=24, temperature=0, stream=True)
        chunks = list(stream)
        assert chunks[0].choices[0].delta.role == "assistant"
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        expected = full.choices[0].message.content
    assert expected, "greedy completion should not be empty"
    assert streamed == expected
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [full.choices[0].finish_reason]
    assert set(chunks[-1].model_extra["speculative"]) == SPEC_KEYS


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_greedy_speculation_on_equals_off(http: httpx.Client, endpoint: str) -> None:
    path, base = (
        ("/v1/completions", {"prompt": PROMPT}) if endpoint == "completions" else ("/v1/chat/completions", {"messages": MESSAGES})
    )

    def run(**extra) -> tuple[str, dict]:
        r = http.post(path, json={"model": MODEL, **base, "max_tokens": 32, "temperature": 0, **extra})
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        return choice.get("text", choice.get("message", {}).get("content")), r.json()["speculative"]

    on_text, on_spec = run()
    off_text, off_spec = run(speculative=False)
    zero_text, zero_spec = run(num_speculative_tokens=0)
    k2_text, k2_spec = run(num_speculative_tokens=2)
    assert on_text == off_text == zero_text == k2_text
    assert on_spec["method"] == k2_spec["method"] == "auto" and on_spec["draft_tokens"] > 0
    assert off_spec["method"] == zero_spec["method"] == "none"
    assert off_spec["draft_tokens"] == 0 and off_spec["acceptance_rate"] == 0.0


def test_every_answer_names_one_system_fingerprint(client: openai.OpenAI) -> None:
    """OpenAI's system_fingerprint: one stable string for this server's configuration, on bodies and
    on every chunk (clients compare it to tell whether the backend changed between answers)."""
    chat = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2, temperature=0)
    completion = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, temperature=0)
    chunks = list(client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2, stream=True,
                                                 stream_options={"include_usage": True}))
    prints = {chat.system_fingerprint, completion.system_fingerprint, *(c.system_fingerprint for c in chunks)}
    assert len(prints) == 1 and str(chat.system_fingerprint).startswith("fp_"), prints


def test_chat_stream_with_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=12, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1 and chunks[0].id.startswith("chatcmpl-")
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.total_tokens == last.usage.prompt_tokens + last.usage.completion_tokens
    assert set(last.model_extra["speculative"]) == SPEC_KEYS
    assert all(c.usage is None for c in chunks[:-1])
    text = "".join(c.choices[0].delta.content or "" for c in chunks[:-1] if c.choices)
    full = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=12, temperature=0)
    assert text == full.choices[0].message.content
    assert last.usage.completion_tokens == full.usage.completion_tokens


def test_raw_sse_framing(tiny_server: ServerProcess) -> None:
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 10, "temperature": 0, "stream": True}
    with httpx.stream("POST", tiny_server.url + "/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["cache-control"] == "no-store"
        raw = r.read().decode()
    # Every event is one `data: ...` line followed by a blank line.
    assert raw.endswith("data: [DONE]\n\n")
    events = parse_sse(raw)
    assert events[-1] == "[DONE]" and "[DONE]" not in events[:-1]
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "text_completion" and "usage" not in c for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert set(chunks[-1]["speculative"]) == SPEC_KEYS
    assert all("speculative" not in c for c in chunks[:-1])
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl not installed")
def test_curl_streaming(tiny_server: ServerProcess, http: httpx.Client) -> None:
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 16, "temperature": 0}
    out = subprocess.run(
        [
            "curl", "-N", "-sS", "--max-time", "60", tiny_server.url + "/v1/chat/completions",
            "-H", "Content-Type: application/json", "-d", json.dumps({**body, "stream": True}),
        ],
        capture_output=True, text=True, timeout=90, check=True,
    ).stdout
    events = parse_sse(out)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    streamed = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    full = http.post("/v1/chat/completions", json=body).json()
    assert streamed == full["choices"][0]["message"]["content"]


def test_n_choices_and_seed(http: httpx.Client) -> None:
    body = {"prompt": PROMPT, "max_tokens": 8, "temperature": 1.0, "n": 3, "seed": 1234}
    first = completion_text(http, **body)
    assert [c["index"] for c in first["choices"]] == [0, 1, 2]
    assert 3 <= first["usage"]["completion_tokens"] <= 24
    again = completion_text(http, **body)
    assert [c["text"] for c in again["choices"]] == [c["text"] for c in first["choices"]]


def test_n_choices_streamed(tiny_server: ServerProcess) -> None:
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 6, "temperature": 0, "n": 2, "stream": True}
    raw = httpx.post(tiny_server.url + "/v1/completions", json=body, timeout=60).text
    chunks = [json.loads(e) for e in parse_sse(raw)[:-1]]
    finished = [c["choices"][0]["index"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert sorted(finished) == [0, 1]
    texts = {i: "".join(c["choices"][0]["text"] for c in chunks if c["choices"][0]["index"] == i) for i in (0, 1)}
    assert texts[0] == texts[1]  # greedy: both choices agree
    assert "speculative" in chunks[-1]


def test_prompt_forms(http: httpx.Client) -> None:
    tokens = completion_text(http, prompt=PROMPT, max_tokens=1, temperature=0, echo=True)
    single = completion_text(http, prompt=PROMPT, max_tokens=6, temperature=0)["choices"][0]["text"]
    batch = completion_text(http, prompt=[PROMPT, "Once upon a time"], max_tokens=6, temperature=0)
    assert [c["index"] for c in batch["choices"]] == [0, 1] and batch["choices"][0]["text"] == single
    ids = [504, 2365, 6354, 16438]  # arbitrary in-vocabulary ids
    by_ids = completion_text(http, prompt=ids, max_tokens=4, temperature=0)
    assert by_ids["usage"]["prompt_tokens"] == 4
    nested = completion_text(http, prompt=[ids, ids[:2]], max_tokens=4, temperature=0)
    assert nested["usage"]["prompt_tokens"] == 6 and len(nested["choices"]) == 2
    assert nested["choices"][0]["text"] == by_ids["choices"][0]["text"]
    assert tokens["choices"][0]["text"].startswith(PROMPT)


def test_echo_streamed(tiny_server: ServerProcess, http: httpx.Client) -> None:
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 5, "temperature": 0, "echo": True}
    full = http.post("/v1/completions", json=body).json()["choices"][0]["text"]
    raw = httpx.post(tiny_server.url + "/v1/completions", json={**body, "stream": True}, timeout=60).text
    chunks = [json.loads(e) for e in parse_sse(raw)[:-1]]
    assert chunks[0]["choices"][0]["text"] == PROMPT
    assert "".join(c["choices"][0]["text"] for c in chunks) == full


def test_logprobs(http: httpx.Client, client: openai.OpenAI) -> None:
    body = completion_text(http, prompt=PROMPT, max_tokens=6, temperature=0, logprobs=2)
    choice = body["choices"][0]
    lp = choice["logprobs"]
    n = body["usage"]["completion_tokens"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == n
    assert all(v <= 0.0 for v in lp["token_logprobs"])
    assert all(1 <= len(top) <= 3 for top in lp["top_logprobs"])
    assert lp["text_offset"][0] == 0 and lp["text_offset"] == sorted(lp["text_offset"])
    # Greedy: the chosen token is the most likely one.
    assert all(lp["token_logprobs"][i] >= max(lp["top_logprobs"][i].values()) - 1e-4 for i in range(n))

    chat = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=5, temperature=0, logprobs=True, top_logprobs=3
    )
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens
    assert all(len(t.top_logprobs) == 3 and t.bytes == list(t.token.encode()) for t in content)


def test_stop_sequence(http: httpx.Client) -> None:
    full = completion_text(http, prompt=PROMPT, max_tokens=24, temperature=0, ignore_eos=True)["choices"][0]["text"]
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    if not stop.strip():
        pytest.skip("greedy text has no usable stop string")
    cut = completion_text(http, prompt=PROMPT, max_tokens=24, temperature=0, ignore_eos=True, stop=[stop])
    choice = cut["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["text"] == full[: full.index(stop)]


def test_metrics_exported(http: httpx.Client) -> None:
    completion_text(http, prompt=PROMPT, max_tokens=8, temperature=0)
    text = http.get("/metrics").text
    for name in (
        "specdec_num_requests_running",
        "specdec_num_requests_waiting",
        "specdec_kv_cache_usage_perc",
        "specdec_prompt_tokens_total",
        "specdec_generation_tokens_total",
        "specdec_spec_decode_num_draft_tokens_total",
        "specdec_spec_decode_num_accepted_tokens_total",
        "specdec_spec_decode_acceptance_rate",
        "specdec_spec_decode_draft_tokens_by_source_total",
        "specdec_spec_decode_accepted_tokens_by_source_total",
        "specdec_spec_decode_draft_seconds_total",
        "specdec_target_forward_seconds_total",
        'specdec_spec_decode_accepted_length_bucket{le="+Inf",model_name="tiny"}',
        'specdec_num_requests_waiting{model_name="tiny"}',
        'specdec_request_queue_time_seconds_count{model_name="tiny"}',
        'specdec_request_prefill_time_seconds_count{model_name="tiny"}',
        "specdec_time_to_first_token_seconds_count",
        "specdec_inter_token_latency_seconds_count",
        "specdec_e2e_request_latency_seconds_count",
        "specdec_engine_healthy",
    ):
        assert metric_value(text, name) is not None, f"{name} missing from /metrics"
    assert metric_value(text, "specdec_generation_tokens_total") > 0
    assert metric_value(text, "specdec_spec_decode_num_draft_tokens_total") > 0
    by_source = [line for line in text.splitlines() if line.startswith("specdec_spec_decode_draft_tokens_by_source_total{")]
    assert sum(float(line.rsplit(" ", 1)[1]) for line in by_source) == metric_value(
        text, "specdec_spec_decode_num_draft_tokens_total"), by_source
    assert metric_value(text, "specdec_target_forward_seconds_total") > 0
    assert metric_value(text, "specdec_time_to_first_token_seconds_count") >= 1
    assert metric_value(text, "specdec_inter_token_latency_seconds_count") >= 1
    assert 0.0 <= metric_value(text, "specdec_kv_cache_usage_perc") <= 1.0
    assert metric_value(text, "specdec_engine_healthy") == 1.0
    assert metric_value(text, "specdec_request_prefill_time_seconds_count") >= 1
    assert metric_value(text, "specdec_request_queue_time_seconds_count") >= 1


def test_logit_bias_and_min_tokens_are_honoured(client: openai.OpenAI) -> None:
    """+100 on a token makes greedy decoding write only it; with that token also a stop token,
    min_tokens holds the stop back for exactly that many tokens (speculation on: the same rule
    warps draft and target rows)."""
    forced = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5, temperature=0, logprobs=0,
                                       logit_bias={"1012": 100})
    tokens = forced.choices[0].logprobs.tokens
    assert len(tokens) == 5 and len(set(tokens)) == 1
    held = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=10, temperature=0, logit_bias={"1012": 100},
                                     extra_body={"min_tokens": 3, "stop_token_ids": [1012]})
    assert held.choices[0].finish_reason == "stop" and held.usage.completion_tokens == 4
    plain = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=10, temperature=0, logit_bias={"1012": 100},
                                      extra_body={"stop_token_ids": [1012]})
    assert plain.usage.completion_tokens == 1
