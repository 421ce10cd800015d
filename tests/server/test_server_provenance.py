"""The ``specdec_provenance`` stream extension against a real ``specdec serve`` (tiny draft pair,
speculating on every step): off unless asked for, each chunk's pieces are exactly its text, the
sources are proposers' names or ``target``, and the OpenAI SDK streams such a request unchanged."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.helpers.servers import ServerProcess, parse_sse

MODEL = "tiny"
SOURCES = {"draft", "ngram", "suffix", "target"}  # the proposers auto picks from, and the target
BODIES = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "Tell me a story about a fox."}]},
    "/v1/completions": {"prompt": "The quick brown fox"},
}


@pytest.fixture(scope="module")
def http(tiny_server: ServerProcess):
    with httpx.Client(base_url=tiny_server.url, timeout=120) as c:
        yield c


def stream(http: httpx.Client, endpoint: str, **extra) -> list[dict]:
    body = {"model": MODEL, "max_tokens": 48, "temperature": 0, "stream": True, **BODIES[endpoint], **extra}
    r = http.post(endpoint, json=body)
    assert r.status_code == 200, r.text
    events = parse_sse(r.text)
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def chunk_text(endpoint: str, choice: dict) -> str:
    if endpoint == "/v1/completions":
        return choice["text"]
    return choice["delta"].get("content") or ""


@pytest.mark.parametrize("endpoint", list(BODIES))
def test_provenance_pieces_are_the_streamed_text(http: httpx.Client, endpoint: str) -> None:
    plain = stream(http, endpoint)
    traced = stream(http, endpoint, specdec_provenance=True)
    assert all("provenance" not in c for chunk in plain for c in chunk["choices"])
    text = "".join(chunk_text(endpoint, c) for chunk in traced for c in chunk["choices"])
    assert text == "".join(chunk_text(endpoint, c) for chunk in plain for c in chunk["choices"])
    assert text, "the tiny model wrote nothing to attribute"
    sources = []
    for chunk in traced:
        for choice in chunk["choices"]:
            pieces = choice.get("provenance")
            if chunk_text(endpoint, choice):
                assert pieces, f"a chunk with text but no provenance: {chunk}"
            if pieces is None:
                continue
            assert "".join(p["text"] for p in pieces) == chunk_text(endpoint, choice)
            assert all(set(p) == {"text", "source"} and p["text"] for p in pieces)
            sources += [p["source"] for p in pieces]
    assert set(sources) <= SOURCES
    # The server speculates on every step (auto: the draft model, which is the target less one
    # layer, or a lookup in the request's own text or others' outputs, which random models repeat):
    # some drafts are accepted. Every step ends with a token the target sampled itself.
    assert set(sources) - {"target"} and "target" in sources
    spec = traced[-1]["speculative"]
    assert spec["accepted_tokens"] > 0


@pytest.mark.parametrize("value", ["yes", 1, [True]])
def test_a_bad_type_is_a_400_naming_the_field(http: httpx.Client, value) -> None:
    r = http.post("/v1/chat/completions", json={"model": MODEL, "stream": True, "specdec_provenance": value,
                                                **BODIES["/v1/chat/completions"]})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "specdec_provenance" and err["code"] == "invalid_type"


def test_only_streams_carry_provenance(http: httpx.Client) -> None:
    r = http.post("/v1/completions", json={"model": MODEL, "specdec_provenance": True, **BODIES["/v1/completions"]})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "specdec_provenance" and "'stream'" in r.json()["error"]["message"]
    r = http.post("/v1/completions", json={"model": MODEL, "specdec_provenance": False, "max_tokens": 2,
                                           **BODIES["/v1/completions"]})
    assert r.status_code == 200 and "provenance" not in r.json()["choices"][0]


def test_the_openai_sdk_streams_it_and_keeps_the_pieces_as_extra_fields(tiny_server: ServerProcess) -> None:
    client = openai.OpenAI(base_url=tiny_server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    text, pieces = [], []
    for chunk in client.chat.completions.create(
        model=MODEL, messages=BODIES["/v1/chat/completions"]["messages"], max_tokens=24, temperature=0, stream=True,
        extra_body={"specdec_provenance": True},
    ):
        for choice in chunk.choices:
            text.append(choice.delta.content or "")
            pieces += (choice.model_extra or {}).get("provenance") or []
    assert "".join(text) and "".join(p["text"] for p in pieces) == "".join(text)
