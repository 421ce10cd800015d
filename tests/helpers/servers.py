"""Helpers for the server tests: a real ``specdec serve`` subprocess, and an in-thread server over a
scripted stand-in engine for faults the real engine cannot be made to produce on demand.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from httpx_sse import EventSource

REPO_ROOT = Path(__file__).resolve().parents[2]
# ``ServerProcess(..., entry=HELD_STEP_ENTRY)``: ``specdec serve`` with the test hooks of
# tests/helpers/held_step_server.py (held steps and loads, per-request faults), run from REPO_ROOT.
HELD_STEP_ENTRY = ["-m", "tests.helpers.held_step_server"]
# The keyed server (tests/server/conftest.py's ``keyed_server``), shared by the Responses, Messages,
# CORS and chat-page tests: an API key, a small response store (so the key and eviction are the real
# server's), browser origins allowed, and the draft model as the only proposer (the page colours it).
KEYED_API_KEY = "sk-test-responses-8d41c07e"
KEYED_STORE_ENTRIES = 3
KEYED_ORIGIN = "http://app.example:3000"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_sse(raw: str) -> list[str]:
    """The ``data:`` payloads of an SSE body, in order (comments and blank lines skipped).

    Parsed by ``httpx-sse``, the parser the bench and the locustfile use too; the server sends data
    fields only, so any other field is a bug. A last event without its blank line still counts.
    """
    response = httpx.Response(200, headers={"content-type": "text/event-stream"}, text=raw + "\n\n")
    events = list(EventSource(response).iter_sse())
    for event in events:
        assert (event.event, event.id, event.retry) == ("message", "", None), f"unexpected SSE field in {event!r}"
    return [event.data for event in events]


def parse_named_sse(raw: str) -> list[dict]:
    """The JSON payloads of an SSE body whose events are named (the Responses and Messages APIs),
    each checked to be named as its ``type`` says."""
    response = httpx.Response(200, headers={"content-type": "text/event-stream"}, text=raw + "\n\n")
    payloads = []
    for event in EventSource(response).iter_sse():
        payload = json.loads(event.data)
        assert event.event == payload["type"], f"event {event.event!r} carries a {payload['type']!r}"
        payloads.append(payload)
    return payloads


def metric_value(text: str, name: str) -> float | None:
    """A sample's value from Prometheus text; ``name`` as printed with its labels, or without any
    labels to take the first sample of that name whatever its labels (``model_name``)."""
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        sample = line.rsplit(" ", 1)[0]
        if sample == name or ("{" not in name and sample.split("{", 1)[0] == name):
            return float(line.rsplit(" ", 1)[1])
    return None


# -- the real server, as a subprocess ----------------------------------------------------------------


class ServerProcess:
    """``python -m server serve ...`` on a free loopback port; logs to a file, always killed.

    ``entry`` replaces ``-m server`` (e.g. a test launcher with hooks); its stdin is then a pipe
    the test writes commands to (``send``)."""

    def __init__(
        self, args: list[str], log_path: Path, env: dict[str, str] | None = None, entry: list[str] | None = None,
        command: str = "serve",
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        cmd = [sys.executable, *(entry or ["-m", "server"]), command, "--host", "127.0.0.1", "--port", str(self.port), *args]
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(
            cmd, cwd=REPO_ROOT, stdout=self._log, stderr=subprocess.STDOUT, env=full_env,
            stdin=subprocess.PIPE if entry else None,
        )

    def send(self, line: str) -> None:
        """A command line to the launcher's stdin (``entry`` servers only)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def wait_log(self, text: str, timeout: float = 120.0) -> None:
        """Wait until the log contains ``text`` (an event the server reports, not a duration)."""
        deadline = time.monotonic() + timeout
        while text not in self.logs():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{text!r} not logged after {timeout}s:\n{self.logs()[-4000:]}")
            time.sleep(0.05)

    def logs(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 180.0) -> None:
        """Until /health answers 200 and the tokenizer view a server builds after its ready line
        is built: that build holds the GIL (~1 s for SmolLM2's tokenizer), so a test timing
        /health must not meet it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.logs()[-4000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    if "is built while the engine is idle" in self.logs():
                        self.wait_log("view of the tokenizer while idle: done", max(deadline - time.monotonic(), 1.0))
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"server not ready after {timeout}s:\n{self.logs()[-4000:]}")

    def terminate(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._close_files()
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._close_files()

    def _close_files(self) -> None:
        self._log.close()
        if self.proc.stdin is not None:
            self.proc.stdin.close()


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``predicate`` until it holds; ``timeout`` only bounds a wait that something broke."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@contextlib.contextmanager
def serving(srv: ServerProcess, timeout: float = 30) -> Iterator[ServerProcess]:
    """A started server for a module's tests; SIGTERM at the end must make it exit 0."""
    try:
        srv.wait_ready()
        yield srv
    finally:
        rc = srv.terminate(timeout=timeout)
    assert rc == 0


# One real server per configuration for the whole session: starting one costs seconds (imports,
# model load), and tests in several modules share it. Fixtures defined here are imported into each
# module; the cache makes them share one process, and session teardown stops it once.
_SHARED: dict[str, ServerProcess] = {}


def shared_server(
    name: str, args: list[str], log_dir: Path, env: dict[str, str] | None = None, entry: list[str] | None = None,
) -> ServerProcess:
    srv = _SHARED.get(name)
    if srv is None or srv.proc.poll() is not None:
        srv = ServerProcess(args, log_dir / f"{name}.log", env=env, entry=entry)
        try:
            srv.wait_ready()
        except BaseException:
            srv.kill()
            raise
        _SHARED[name] = srv
    return srv


def stop_shared(name: str) -> None:
    """SIGTERM a shared server; an idle server must then exit 0 promptly (checked here)."""
    srv = _SHARED.pop(name, None)
    if srv is not None:
        rc = srv.terminate(timeout=20)
        assert rc == 0, f"{name} server exited with {rc} on SIGTERM:\n{srv.logs()[-3000:]}"


# The agents' server (``agent_server``): Claude Code's first request is ~46k tokens of SmolLM2's tokenizer.
AGENT_MODEL, AGENT_CONTEXT = "tiny-agent", 65_536
TINY_MAX_MODEL_LEN = 512
TINY_MAX_NUM_SEQS = 8


def tiny_args(target: Path, draft: Path, *extra: str) -> list[str]:
    return [
        "--model", str(target), "--draft-model", str(draft), "--served-model-name", "tiny",
        "--device", "cpu", "--dtype", "float32", "--max-num-seqs", str(TINY_MAX_NUM_SEQS),
        "--max-model-len", str(TINY_MAX_MODEL_LEN), "--seed", "0",
        # Speculate on every step: on tiny models the cost model may rightly find speculation does
        # not pay, and these tests are about its mechanics (the policy has tests of its own).
        "--no-adaptive-speculation", *extra,
    ]


# -- a scripted stand-in engine, served in a thread ----------------------------------------------------


@dataclass
class Script:
    """How the fake engine answers the next requests."""

    fail_after: int | None = None  # finish with finish_reason="error" after this many tokens
    raise_after: int | None = None  # raise from the stream iterator after this many tokens
    raise_on_add: BaseException | None = None
    delay_s: float = 0.0


class FakeStream:
    def __init__(self, engine: FakeEngine, request_id: str, prompt_ids: list[int], params: Any) -> None:
        self.engine = engine
        self.request_id = request_id
        self.prompt_token_ids = prompt_ids
        self.params = params
        self.script = engine.script
        self.aborted = False
        self.done = False

    def abort(self) -> None:
        self.aborted = True

    def __aiter__(self) -> Iterator:
        return self._run()

    async def _run(self):
        from specdec_core.decoding.token_logprob import TokenLogprob
        from specdec_core.engine.outputs import RequestOutput, RequestStats

        stats = RequestStats(prompt_tokens=len(self.prompt_token_ids))
        try:
            for i in range(self.params.max_tokens):
                await asyncio.sleep(self.script.delay_s)
                if self.aborted:
                    yield RequestOutput(self.request_id, [], "", True, "abort", stats=stats)
                    return
                if self.script.raise_after is not None and i >= self.script.raise_after:
                    raise RuntimeError("scripted stream failure")
                if self.script.fail_after is not None and i >= self.script.fail_after:
                    yield RequestOutput(self.request_id, [], "", True, "error", error="scripted failure", stats=stats)
                    return
                tid = 100 + i
                stats.completion_tokens += 1
                stats.verify_steps += 1
                last = i == self.params.max_tokens - 1
                lps = [TokenLogprob(tid, -0.5, [(tid, -0.5)])] if self.params.logprobs is not None else None
                yield RequestOutput(
                    self.request_id, [tid], f" w{i}", last, "length" if last else None, logprobs=lps,
                    stats=stats if last else None,
                )
        finally:
            self.done = True
            self.engine.live.discard(self)


class FakeEngine:
    """Implements the engine contract the server relies on, with scripted faults."""

    speculative_method = "ngram"
    num_speculative_tokens = 4
    max_model_len = 2048
    model_name = "fake-model"

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = len(tokenizer)
        self.script = Script()
        self.healthy = True
        self.live: set[FakeStream] = set()
        self.submitted = 0  # requests ever added (polling `live` can miss a short-lived one)
        self.shut_down = False

    @property
    def is_healthy(self) -> bool:
        return self.healthy

    @property
    def dead_reason(self) -> str | None:
        return None if self.healthy else "scripted death"

    @property
    def num_unfinished(self) -> int:
        return len(self.live)

    def add_request(self, prompt: Any, params: Any, request_id: str | None = None) -> FakeStream:
        if self.script.raise_on_add is not None:
            raise self.script.raise_on_add
        stream = FakeStream(self, request_id or "x", list(prompt), params)
        self.submitted += 1
        self.live.add(stream)
        return stream

    def abort(self, request_id: str) -> None:
        for s in list(self.live):
            if s.request_id == request_id:
                s.abort()

    def metrics(self) -> Any:
        """The engine's own counters (all zero) with this fake's running count: a new counter
        in ``EngineMetrics`` reaches the fake without editing it."""
        from specdec_core.engine.stats import EngineMetrics

        return EngineMetrics(num_running=len(self.live))

    def shutdown(self) -> None:
        self.shut_down = True


@dataclass
class ThreadServer:
    """A uvicorn server running ``app`` in a background thread (no signal handling)."""

    app: Any
    port: int = field(default_factory=free_port)

    def __post_init__(self) -> None:
        import uvicorn

        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, lifespan="on", log_config=None, ws="none")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> ThreadServer:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("in-thread server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(20)

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise TimeoutError("condition not reached")
            time.sleep(0.02)
