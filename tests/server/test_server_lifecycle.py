"""Process lifecycle of ``specdec serve``: JSON request logs, and SIGTERM that drains in-flight
streams before exiting 0. (Every other test server is also SIGTERMed idle and must exit 0.)"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import httpx
import pytest

from tests.helpers.servers import ServerProcess, parse_sse, tiny_args


@pytest.fixture
def own_server(tiny_target: Path, tiny_draft: Path, tmp_path: Path):
    # A grace period no machine can hit: the drain must finish the stream however slow the machine.
    srv = ServerProcess(tiny_args(tiny_target, tiny_draft), tmp_path / "server.log", env={"SPECDEC_SHUTDOWN_GRACE": "900"})
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.kill()


def json_records(logs: str) -> list[dict]:
    # stderr is a pipe here, so our log lines are JSON; other lines (progress bars) are skipped.
    return [json.loads(line) for line in logs.splitlines() if line.startswith("{")]


def test_sigterm_drains_inflight_stream_then_exits_zero(own_server: ServerProcess) -> None:
    url = own_server.url
    # One ordinary request first, to check its log line after exit.
    r = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "Hi", "max_tokens": 3, "temperature": 0})
    request_id = r.headers["x-request-id"]
    assert r.json()["id"] == f"cmpl-{request_id}"

    max_tokens = 300
    body = {
        "model": "tiny", "prompt": "A long story:", "max_tokens": max_tokens, "temperature": 0,
        "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
    }
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        raw = []
        for line in lines:
            raw.append(line)
            if line.startswith("data: "):
                break  # the stream is under way
        own_server.proc.send_signal(signal.SIGTERM)
        # Draining: health says so as soon as the signal is handled (waited for, not slept on) ...
        while httpx.get(url + "/health").status_code != 503:
            assert own_server.proc.poll() is None, "the server exited before draining its stream"
        # ... no new work is admitted, but the open stream continues.
        refused = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "new", "max_tokens": 2})
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "shutting_down"
        assert httpx.get(url + "/health").status_code == 503
        raw.extend(lines)
    events = parse_sse("\n".join(raw) + "\n")
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert not any("error" in c for c in chunks)
    assert chunks[-1]["usage"]["completion_tokens"] == max_tokens
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert finishes == ["length"]
    assert own_server.proc.wait(timeout=30) == 0

    logs = own_server.logs()
    # Progress bars belong on a terminal: with stderr a pipe, every line is one JSON object.
    assert all(line.startswith("{") for line in logs.splitlines() if line.strip()), logs[:3000]
    records = json_records(logs)
    assert any(rec["event"].startswith("ready") and rec.get("url") == url + "/v1" for rec in records)
    # The loading story, in order; nothing before "ready" claims the server is up (uvicorn's own
    # "running on"/"startup complete" lines come before the model is loaded).
    events = [rec["event"] for rec in records]
    story = ["listening on", "starting the engine (", "loading the target model", "loading the draft model",
             "starting the engine (loading the models, preparing their kernels, calibrating): done", "ready: serving"]
    positions = [next((i for i, e in enumerate(events) if e.startswith(step)), -1) for step in story]
    assert -1 not in positions and positions == sorted(positions), list(zip(story, positions))
    assert not any(e.startswith(("Uvicorn running", "Application startup complete")) for e in events)
    assert any(rec["event"].startswith("drained") for rec in records)
    mine = [rec for rec in records if rec["event"] == "request" and rec.get("request_id") == request_id]
    assert len(mine) == 1, "exactly one log line per request"
    line = mine[0]
    assert line["status"] == 200 and line["prompt_tokens"] >= 1 and line["completion_tokens"] >= 1
    for key in ("ttft_s", "total_s", "acceptance_rate", "speculative_method", "outcome", "level", "timestamp"):
        assert key in line
