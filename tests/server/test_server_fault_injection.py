"""Per-request failures with the REAL engine in a real ``specdec serve`` subprocess.

test_server_faults.py proves the server's failure handling against a scripted stand-in engine; here
the tests' fault hook (``tests/helpers/held_step_server.py`` with ``FAULT_MARKER=<marker>``: a request whose prompt text
contains the marker raises inside the engine while its tokens are committed) produces the failure,
so the whole path is real: the engine isolates the request, the async engine reports it, and the
server turns it into a 500 / an SSE error event while every other request keeps running.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.helpers.servers import HELD_STEP_ENTRY, ServerProcess, metric_value, parse_sse, shared_server, stop_shared, tiny_args, wait_until

MODEL = "tiny"
MARKER = "BOOM"
SERVER_NAME = "tiny_fault_injection"
C, CHAT = "/v1/completions", "/v1/chat/completions"
BOOM_BODY = {"model": MODEL, "prompt": f"Please {MARKER} now:", "max_tokens": 16, "temperature": 0}
OK_BODY = {"model": MODEL, "prompt": "A healthy prompt:", "max_tokens": 8, "temperature": 0}


@pytest.fixture(scope="module")
def fault_server(tiny_target: Path, tiny_draft: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One tiny-model server whose engine fails every request mentioning MARKER (--max-num-seqs 4).

    Teardown SIGTERMs it and checks it exits 0: the failures left nothing behind to wait on."""
    args = tiny_args(tiny_target, tiny_draft, "--max-num-seqs", "4")  # the last --max-num-seqs wins
    srv = shared_server(SERVER_NAME, args, tmp_path_factory.getbasetemp(), env={"FAULT_MARKER": MARKER},
                        entry=HELD_STEP_ENTRY)
    yield srv
    stop_shared(SERVER_NAME)


def error_of(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert "Traceback" not in r.text and "fault injected" not in r.text, r.text
    return err


def engine_running(url: str) -> float | None:
    return metric_value(httpx.get(url + "/metrics", timeout=10).text, "specdec_num_requests_running")




def finished(url: str, reason: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    return metric_value(text, f'specdec_request_finished_total{{finish_reason="{reason}"}}') or 0.0


def test_completion_failure_is_a_500_error_object(fault_server: ServerProcess) -> None:
    before = finished(fault_server.url, "error")
    err = error_of(httpx.post(fault_server.url + C, json=BOOM_BODY, timeout=60), 500)
    assert err["type"] == "server_error" and err["code"] == "internal_error"
    assert finished(fault_server.url, "error") == before + 1
    # The engine is still up and serves the next request.
    assert httpx.get(fault_server.url + "/health", timeout=10).status_code == 200
    ok = httpx.post(fault_server.url + C, json=OK_BODY, timeout=60)
    assert ok.status_code == 200, ok.text
    assert ok.json()["choices"][0]["finish_reason"] in ("length", "stop")


def test_streamed_failure_is_an_error_event_then_done(fault_server: ServerProcess) -> None:
    with httpx.stream("POST", fault_server.url + C, json={**BOOM_BODY, "stream": True}, timeout=60) as r:
        assert r.status_code == 200  # the headers went out before the engine failed
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    events = parse_sse(raw)
    assert events[-1] == "[DONE]", raw
    last = json.loads(events[-2])
    assert set(last) == {"error"}, raw
    assert set(last["error"]) == {"message", "type", "param", "code"}
    assert last["error"]["type"] == "server_error"
    assert "Traceback" not in raw and "fault injected" not in raw
    # Nothing after [DONE], and no chunk claims a normal finish.
    for e in events[:-2]:
        for choice in json.loads(e).get("choices", []):
            assert choice.get("finish_reason") is None, raw


def test_chat_failure_is_a_500_error_object(fault_server: ServerProcess) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": f"Say {MARKER} please."}], "max_tokens": 16,
            "temperature": 0}
    err = error_of(httpx.post(fault_server.url + CHAT, json=body, timeout=60), 500)
    assert err["type"] == "server_error"
    ok = httpx.post(fault_server.url + CHAT, json={**body, "messages": [{"role": "user", "content": "Say hi."}]},
                    timeout=60)
    assert ok.status_code == 200, ok.text


def test_failure_beside_a_healthy_stream_leaves_it_whole(fault_server: ServerProcess) -> None:
    """A failing request batched with a healthy greedy stream: the stream still gets every token,
    ends with finish_reason "length", and matches the same request run on its own afterwards."""
    max_tokens = 64
    healthy = {
        "model": MODEL, "prompt": "Count slowly, one number a line:", "max_tokens": max_tokens, "temperature": 0,
        "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
    }
    got: dict = {"events": [], "times": []}
    started = threading.Event()

    def read_healthy() -> None:
        try:
            with httpx.stream("POST", fault_server.url + C, json=healthy, timeout=60) as r:
                got["status"] = r.status_code
                buf = ""
                for line in r.iter_lines():
                    buf += line + "\n"
                    if line.startswith("data: "):
                        got["times"].append(time.monotonic())
                        started.set()
                got["events"] = parse_sse(buf)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            got["exc"] = exc
        finally:
            started.set()

    errors_before = finished(fault_server.url, "error")
    reader = threading.Thread(target=read_healthy, daemon=True)
    reader.start()
    assert started.wait(60), "the healthy stream produced nothing"
    boom = httpx.post(fault_server.url + C, json={**BOOM_BODY, "max_tokens": max_tokens}, timeout=60)
    boom_done = time.monotonic()
    error_of(boom, 500)
    reader.join(60)
    assert not reader.is_alive(), "the healthy stream did not finish"
    assert "exc" not in got, got.get("exc")
    assert got["status"] == 200

    events = got["events"]
    assert events and events[-1] == "[DONE]", events
    chunks = [json.loads(e) for e in events[:-1]]
    assert not any("error" in c for c in chunks), chunks
    text = "".join(ch["text"] for c in chunks for ch in c.get("choices", []))
    finishes = [ch["finish_reason"] for c in chunks for ch in c.get("choices", []) if ch.get("finish_reason")]
    assert finishes == ["length"], chunks
    usage = [c["usage"] for c in chunks if c.get("usage")]
    assert usage and usage[-1]["completion_tokens"] == max_tokens, usage
    # The failure really happened while the healthy stream was in flight, not after it.
    assert got["times"][-1] > boom_done, "the healthy stream had already ended before the failure"
    assert finished(fault_server.url, "error") == errors_before + 1

    # The healthy stream was not disturbed: greedy, alone, gives the same text.
    plain = {k: v for k, v in healthy.items() if k not in ("stream", "stream_options")}
    alone = httpx.post(fault_server.url + C, json=plain, timeout=60)
    assert alone.status_code == 200, alone.text
    assert alone.json()["choices"][0]["text"] == text
    assert alone.json()["usage"]["completion_tokens"] == max_tokens

    wait_until(lambda: engine_running(fault_server.url) == 0.0, 10, "the engine to have no running requests")
    text = httpx.get(fault_server.url + "/metrics", timeout=10).text
    assert metric_value(text, "specdec_num_requests_waiting") == 0.0
    assert metric_value(text, "specdec_engine_healthy") == 1.0
