"""Faults the real engine cannot be made to produce on demand, through a scripted stand-in engine:
per-request failures (500 / SSE error event), a dead engine loop, loading, failed loading."""

from __future__ import annotations

import concurrent.futures
import json
import socket
import threading
from pathlib import Path

import httpx
import pytest

from server.app import build_app
from server.settings import ServerSettings
from tests.helpers.servers import FakeEngine, Script, ThreadServer, parse_sse

C, CHAT = "/v1/completions", "/v1/chat/completions"
BODY = {"model": "fake", "prompt": "hello", "max_tokens": 5}
CHAT_BODY = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}


@pytest.fixture(scope="module")
def tokenizer(smol_tokenizer_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smol_tokenizer_dir)


@pytest.fixture
def fake(tokenizer) -> FakeEngine:
    return FakeEngine(tokenizer)


@pytest.fixture
def served(fake: FakeEngine):
    app = build_app(ServerSettings(served_model_name="fake"), engine_factory=lambda cfg: fake)
    with ThreadServer(app) as srv:
        srv.wait_for(lambda: httpx.get(srv.url + "/health").status_code == 200)
        yield srv


def error_of(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and "Traceback" not in err["message"]
    return err


@pytest.mark.parametrize("fault", ["finish_error", "stream_raises"])
@pytest.mark.parametrize("path,body", [(C, BODY), (CHAT, CHAT_BODY)], ids=["completions", "chat"])
def test_request_failure_is_a_500_and_others_keep_working(served, fake: FakeEngine, fault, path, body) -> None:
    fake.script = Script(fail_after=2) if fault == "finish_error" else Script(raise_after=2)
    err = error_of(httpx.post(served.url + path, json=body), 500)
    assert err["type"] == "server_error" and "scripted" not in err["message"]
    fake.script = Script()
    assert httpx.post(served.url + path, json=body).status_code == 200


@pytest.mark.parametrize("fault", ["finish_error", "stream_raises"])
def test_stream_failure_is_an_error_event_then_done(served, fake: FakeEngine, fault) -> None:
    fake.script = Script(fail_after=2) if fault == "finish_error" else Script(raise_after=2)
    r = httpx.post(served.url + C, json={**BODY, "stream": True})
    assert r.status_code == 200
    events = parse_sse(r.text)
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    assert set(last) == {"error"} and last["error"]["type"] == "server_error"
    texts = [json.loads(e)["choices"][0]["text"] for e in events[:-2]]
    assert texts == [" w0", " w1"]  # what was produced before the failure still arrived
    fake.script = Script()
    ok = parse_sse(httpx.post(served.url + C, json={**BODY, "stream": True}).text)
    assert ok[-1] == "[DONE]" and "error" not in json.loads(ok[-2])


def test_one_failing_choice_fails_the_request_and_aborts_the_rest(served, fake: FakeEngine) -> None:
    fake.script = Script(fail_after=1, delay_s=0.01)
    error_of(httpx.post(served.url + C, json={**BODY, "n": 3, "max_tokens": 50}), 500)
    served.wait_for(lambda: fake.num_unfinished == 0)


def test_add_request_failure(served, fake: FakeEngine) -> None:
    fake.script = Script(raise_on_add=RuntimeError("boom"))
    err = error_of(httpx.post(served.url + C, json=BODY), 500)
    assert "boom" not in err["message"]
    fake.script = Script(raise_on_add=ValueError("prompt is too long for this engine"))
    err = error_of(httpx.post(served.url + C, json=BODY), 400)
    assert err["param"] == "prompt"


def test_dead_engine_reports_503(served, fake: FakeEngine) -> None:
    fake.healthy = False
    r = httpx.get(served.url + "/health")
    assert r.status_code == 503 and r.json() == {"status": "dead", "reason": "scripted death"}
    err = error_of(httpx.post(served.url + C, json=BODY), 503)
    assert err["code"] == "engine_dead"
    assert "specdec_engine_healthy 0.0" in httpx.get(served.url + "/metrics").text


def test_disconnects_abort_engine_requests(served, fake: FakeEngine) -> None:
    fake.script = Script(delay_s=0.02)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(httpx.post, served.url + C, json={**BODY, "max_tokens": 1000}, timeout=2.0)
        served.wait_for(lambda: fake.submitted == 1)
        with pytest.raises(httpx.ReadTimeout):
            pending.result()  # the client gives up and closes its connection
    served.wait_for(lambda: fake.num_unfinished == 0, timeout=5)
    with httpx.stream("POST", served.url + CHAT, json={**CHAT_BODY, "max_tokens": 1000, "stream": True}) as r:
        next(r.iter_lines())
        assert fake.submitted == 2
    served.wait_for(lambda: fake.num_unfinished == 0, timeout=5)


def test_client_gone_before_first_chunk_leaks_nothing(served, fake: FakeEngine) -> None:
    """A client that sends a streaming request and hangs up at once: its engine request is aborted
    even if the response never got to iterate its body."""
    fake.script = Script(delay_s=0.02)
    body = json.dumps({**CHAT_BODY, "max_tokens": 1000, "stream": True}).encode()
    head = (
        f"POST {CHAT} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    for _ in range(5):
        with socket.create_connection(("127.0.0.1", served.port)) as sock:
            sock.sendall(head + body)
    served.wait_for(lambda: fake.num_unfinished == 0, timeout=5)
    state = served.app.state.server
    served.wait_for(lambda: not state.in_flight, timeout=5)


def test_loading_then_ready(tokenizer) -> None:
    release = threading.Event()
    engine = FakeEngine(tokenizer)

    def slow_factory(cfg):
        release.wait(20)
        return engine

    app = build_app(ServerSettings(served_model_name="fake"), engine_factory=slow_factory)
    with ThreadServer(app) as srv:
        r = httpx.get(srv.url + "/health")
        assert r.status_code == 503 and r.json() == {"status": "loading"}
        err = error_of(httpx.post(srv.url + C, json=BODY), 503)
        assert err["code"] == "model_loading"
        release.set()
        srv.wait_for(lambda: httpx.get(srv.url + "/health").status_code == 200)
        assert httpx.post(srv.url + C, json=BODY).status_code == 200
    assert engine.shut_down


def test_failed_load_reports_and_signals_fatal() -> None:
    codes: list[int] = []

    def broken(cfg):
        raise FileNotFoundError("no such model: /nowhere")

    app = build_app(ServerSettings(), engine_factory=broken, on_fatal=codes.append)
    with ThreadServer(app) as srv:
        srv.wait_for(lambda: codes == [1])
        r = httpx.get(srv.url + "/health")
        assert r.status_code == 503 and r.json()["status"] == "failed" and "/nowhere" in r.json()["reason"]
        error_of(httpx.post(srv.url + C, json=BODY), 503)


def test_a_malformed_model_file_is_one_log_line_and_exit_2(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found while loading (a tensor that is not the model's): the user's file, not a fault of the
    server, so one error line saying what is wrong (no traceback) and exit status 2."""
    import server.app
    from specdec_core.loading.model_errors import ModelFileError

    codes: list[int] = []
    logged: list[tuple[str, str, dict]] = []

    class Log:
        def info(self, event: str, **kw: object) -> None:
            pass

        def error(self, event: str, **kw: object) -> None:
            logged.append(("error", event, kw))

        def exception(self, event: str, **kw: object) -> None:
            logged.append(("exception", event, kw))

    def broken(cfg):
        raise ModelFileError("bad.gguf", "token_embd.weight rows", "49152, the vocabulary (llama.vocab_size)", 100)

    monkeypatch.setattr(server.app, "log", Log())
    app = build_app(ServerSettings(), engine_factory=broken, on_fatal=codes.append)
    with ThreadServer(app) as srv:
        srv.wait_for(lambda: codes == [2])
        r = httpx.get(srv.url + "/health")
        assert r.status_code == 503 and "token_embd.weight rows" in r.json()["reason"]
    message = "bad.gguf: token_embd.weight rows: expected 49152, the vocabulary (llama.vocab_size), found 100"
    assert logged == [("error", "engine failed to load: the model file is malformed", {"error": message})]


def test_the_real_engine_builder_freezes_the_startup_heap(tiny_target: Path) -> None:
    """``load_engine`` (what ``specdec serve`` builds) leaves the loaded models out of every later
    garbage collection: without the freeze a full collection walks them each time."""
    import gc

    from server.services.engine_host import load_engine
    from specdec_core.engine.config import EngineConfig

    gc.unfreeze()
    engine = load_engine(EngineConfig(model=str(tiny_target), speculative_method="ngram", max_model_len=256))
    try:
        assert gc.get_freeze_count() > 0
        # get_objects lists the collected generations only: the engine is in the permanent one.
        assert all(o is not engine for o in gc.get_objects())
    finally:
        engine.shutdown()
        gc.unfreeze()


def test_every_5xx_closes_its_connection_and_a_kept_alive_client_goes_on(served, fake: FakeEngine, monkeypatch) -> None:
    """An engine failure (a 500 the server raises) and a bug (an exception nothing expected: the
    tokenizer raising) both answer ``Connection: close``: the client reconnects for its next
    request instead of sending it into a connection the server resets."""

    def broken(*args, **kwargs):
        raise RuntimeError("tokenizer bug")

    with httpx.Client(base_url=served.url, timeout=30) as client:
        assert client.post(C, json=BODY).headers.get("connection") != "close"  # kept alive when all is well
        fake.script = Script(raise_on_add=RuntimeError("boom"))
        r = client.post(C, json=BODY)
        assert error_of(r, 500)["code"] == "internal_error" and r.headers["connection"] == "close"
        fake.script = Script()
        monkeypatch.setattr(fake, "tokenizer", broken)
        r = client.post(C, json=BODY)
        assert error_of(r, 500)["code"] == "internal_error" and r.headers["connection"] == "close"
        assert "tokenizer bug" not in r.text and r.headers["x-request-id"] in r.json()["error"]["message"]
        monkeypatch.undo()
        assert client.post(C, json=BODY).status_code == 200
