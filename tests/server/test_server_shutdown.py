"""SIGTERM under load: every client gets a complete answer, the engine is waited for, exit 0.

The real server process runs through ``tests/helpers/held_step_server.py``, whose hooks hold the engine
thread busy in torch (like a long prefill) on cue, so SIGTERM lands inside a long step on a
machine of any speed. Every wait below is on an event the server reports; the time limits only
keep a broken server from hanging the run.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.helpers.servers import HELD_STEP_ENTRY, ServerProcess, parse_sse, tiny_args

NUM_STREAMS = 4
# Far more tokens than any step emits: the requests are still running when the step is held.
MAX_TOKENS = 400
TIMEOUT_S = 120.0


@dataclass
class Client:
    """One request in its own thread; ``started`` is set once its first data event arrived."""

    url: str
    body: dict
    started: threading.Event = field(default_factory=threading.Event)
    status: int | None = None
    headers: dict = field(default_factory=dict)
    raw: list[str] = field(default_factory=list)
    error: BaseException | None = None

    def run(self) -> None:
        try:
            if self.body.get("stream"):
                with httpx.stream("POST", self.url + "/v1/completions", json=self.body, timeout=TIMEOUT_S) as r:
                    self.status, self.headers = r.status_code, dict(r.headers)
                    for line in r.iter_lines():
                        self.raw.append(line)
                        if line.startswith("data: "):
                            self.started.set()
            else:
                self.started.set()  # nothing arrives before the end: it counts from the engine's side
                r = httpx.post(self.url + "/v1/completions", json=self.body, timeout=TIMEOUT_S)
                self.status, self.headers, self.raw = r.status_code, dict(r.headers), [r.text]
        except BaseException as exc:  # noqa: BLE001 - reported by the test's assertions
            self.error = exc
        finally:
            self.started.set()


def _body(stream: bool, prompt: str) -> dict:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
    return body


def _health_when_listening(srv: ServerProcess) -> dict:
    """The /health body once the port accepts connections."""
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        try:
            return httpx.get(srv.url + "/health", timeout=TIMEOUT_S).json()
        except httpx.ConnectError:
            if time.monotonic() > deadline or srv.proc.poll() is not None:
                raise
            time.sleep(0.05)


def _assert_clean_exit(srv: ServerProcess, rc: int) -> str:
    logs = srv.logs()
    assert rc == 0, f"exit status {rc}:\n{logs[-4000:]}"
    for bad in ("terminate called", "Traceback", "CancelledError"):
        assert bad not in logs, f"{bad!r} in the server log:\n{logs[-4000:]}"
    return logs


def test_sigterm_inside_a_long_step_ends_every_request_and_waits_for_the_engine(
    tiny_target: Path, tiny_draft: Path, tmp_path: Path
) -> None:
    srv = ServerProcess(
        tiny_args(tiny_target, tiny_draft), tmp_path / "server.log", entry=HELD_STEP_ENTRY,
        # The engine is held once all five requests have tokens; a 1 s grace then runs out.
        env={"SPECDEC_SHUTDOWN_GRACE": "1", "HELD_STEP_AFTER": str(NUM_STREAMS + 1)},
    )
    try:
        srv.wait_ready()
        clients = [Client(srv.url, _body(True, f"Story number {i}:")) for i in range(NUM_STREAMS)]
        clients.append(Client(srv.url, _body(False, "A plain request:")))
        threads = [threading.Thread(target=c.run, daemon=True) for c in clients]
        for t in threads:
            t.start()
        for c in clients:
            assert c.started.wait(TIMEOUT_S)
        srv.wait_log("held-step: holding")  # the engine is inside a step that will not end by itself
        srv.proc.send_signal(signal.SIGTERM)

        for t in threads:
            t.join(TIMEOUT_S)
            assert not t.is_alive(), "a request was still open after shutdown ended it"
        for c in clients[:NUM_STREAMS]:
            assert c.error is None, repr(c.error)
            assert c.status == 200
            events = parse_sse("\n".join(c.raw) + "\n")
            assert events[-1] == "[DONE]", f"stream cut without [DONE]: {events[-3:]}"
            last = json.loads(events[-2])
            assert last["error"]["code"] == "aborted", last
            tokens = [json.loads(e) for e in events[:-2]]
            assert tokens and all(ch["choices"][0]["finish_reason"] is None for ch in tokens if ch["choices"])
        plain = clients[-1]
        assert plain.error is None, repr(plain.error)
        assert plain.status == 503, plain.raw
        assert json.loads(plain.raw[0])["error"]["code"] == "aborted"
        assert plain.headers.get("x-request-id")

        # Every client has its answer, but the engine is still inside its step: the server waits.
        srv.wait_log("stopping the engine at its next step boundary")
        assert srv.proc.poll() is None, "the server exited under the engine's running step"
        srv.send("release")
        rc = srv.proc.wait(TIMEOUT_S)
        logs = _assert_clean_exit(srv, rc)
        assert logs.index("held-step: released") < logs.index('"engine stopped"')
    finally:
        srv.kill()


def test_sigterm_while_the_model_loads_exits_zero_at_once(tiny_target: Path, tiny_draft: Path, tmp_path: Path) -> None:
    """A load can take minutes (GGUF conversion): SIGTERM does not wait for it, and the process
    must not be torn down under the loading thread (torch would abort it)."""
    srv = ServerProcess(tiny_args(tiny_target, tiny_draft), tmp_path / "server.log", entry=HELD_STEP_ENTRY, env={"HELD_LOAD": "1"})
    try:
        srv.wait_log("held-load: holding")
        assert _health_when_listening(srv) == {"status": "loading"}
        srv.proc.send_signal(signal.SIGTERM)
        rc = srv.proc.wait(TIMEOUT_S)
        logs = _assert_clean_exit(srv, rc)
        assert "exiting without waiting for the engine thread" in logs
    finally:
        srv.kill()
