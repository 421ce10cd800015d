"""Failures of the engine while a Responses or Messages answer is produced, through the scripted
stand-in engine (the real one cannot fail on demand; see test_server_faults.py): a failure before
the answer is a 500 in the API's own error shape, one mid-stream that API's ``error`` event, after
which the stream ends (no ``[DONE]``, which neither API has); the server keeps answering."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from httpx_sse import EventSource

from server.app import build_app
from server.settings import ServerSettings
from tests.helpers.servers import FakeEngine, Script, ThreadServer

RESPONSES = ("/v1/responses", {"model": "fake", "input": "hi", "max_output_tokens": 5})
MESSAGES = ("/v1/messages", {"model": "fake", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]})


@pytest.fixture(scope="module")
def fake(smol_tokenizer_dir: Path) -> FakeEngine:
    from transformers import AutoTokenizer

    return FakeEngine(AutoTokenizer.from_pretrained(smol_tokenizer_dir))


@pytest.fixture(scope="module")
def served(fake: FakeEngine):
    app = build_app(ServerSettings(served_model_name="fake"), engine_factory=lambda cfg: fake)
    with ThreadServer(app) as srv:
        srv.wait_for(lambda: httpx.get(srv.url + "/health").status_code == 200)
        yield srv


def events(r: httpx.Response) -> list[tuple[str, dict]]:
    return [(e.event, json.loads(e.data)) for e in EventSource(r).iter_sse()]


@pytest.mark.parametrize("fault", [Script(fail_after=2), Script(raise_after=2)], ids=["finish_error", "stream_raises"])
def test_a_failed_answer_is_a_500_in_each_apis_shape(served, fake: FakeEngine, fault: Script) -> None:
    fake.script = fault
    r = httpx.post(served.url + RESPONSES[0], json=RESPONSES[1], timeout=30)
    assert r.status_code == 500 and r.json()["error"]["code"] == "internal_error"
    r = httpx.post(served.url + MESSAGES[0], json=MESSAGES[1], timeout=30)
    assert r.status_code == 500 and r.json() == {"type": "error", "error": {"type": "api_error",
                                                                           "message": r.json()["error"]["message"]}}
    fake.script = Script()
    assert httpx.post(served.url + MESSAGES[0], json=MESSAGES[1], timeout=30).json()["stop_reason"] == "max_tokens"


@pytest.mark.parametrize("fault", [Script(fail_after=2), Script(raise_after=2)], ids=["finish_error", "stream_raises"])
def test_a_stream_that_fails_ends_with_the_apis_error_event(served, fake: FakeEngine, fault: Script) -> None:
    fake.script = fault
    with httpx.stream("POST", served.url + RESPONSES[0], json={**RESPONSES[1], "stream": True}, timeout=30) as r:
        got = events(r)
    names = [name for name, _ in got]
    assert names[:2] == ["response.created", "response.in_progress"] and names[-1] == "error"
    assert "response.completed" not in names and got[-1][1]["code"] == "internal_error"
    assert [d["sequence_number"] for _, d in got] == list(range(len(got)))
    assert "".join(d["delta"] for n, d in got if n == "response.output_text.delta") == " w0 w1"  # what came first arrived
    with httpx.stream("POST", served.url + MESSAGES[0], json={**MESSAGES[1], "stream": True}, timeout=30) as r:
        got = events(r)
    assert got[0][0] == "message_start" and got[-1][0] == "error" and "message_stop" not in [n for n, _ in got]
    assert got[-1][1]["type"] == "error" and got[-1][1]["error"]["type"] == "api_error"
    fake.script = Script()
    with httpx.stream("POST", served.url + MESSAGES[0], json={**MESSAGES[1], "stream": True}, timeout=30) as r:
        assert [n for n, _ in events(r)][-2:] == ["message_delta", "message_stop"]
