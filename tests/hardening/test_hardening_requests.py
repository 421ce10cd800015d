"""Issue 20, requests: odd sampling values behave, admission is released when clients leave and
agrees with /metrics, and structured output is bounded and off the event loop. Real servers,
127.0.0.1 only; every wait bounded."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.helpers.servers import HELD_STEP_ENTRY, TINY_MAX_NUM_SEQS, ServerProcess, metric_value, tiny_args, wait_until

C = "/v1/completions"
WAIT_S = 120.0  # bound on any wait; reached only when something is broken



P = {"model": "tiny", "prompt": "The weather today", "max_tokens": 12, "ignore_eos": True}


@pytest.mark.parametrize("temperature", [1e-38, 1e-30, 9e-6])
def test_a_tiny_temperature_is_greedy(tiny_server: ServerProcess, temperature: float) -> None:
    """T < 1e-5 is greedy (vLLM's rule); 1e-38 divided the logits into inf and sampled from NaN."""
    greedy = httpx.post(tiny_server.url + C, json={**P, "temperature": 0}, timeout=60)
    tiny = httpx.post(tiny_server.url + C, json={**P, "temperature": temperature, "seed": 7}, timeout=60)
    assert greedy.status_code == tiny.status_code == 200, (greedy.text, tiny.text)
    assert tiny.json()["choices"][0]["text"] == greedy.json()["choices"][0]["text"]


# -- admission is released when the client goes, and /metrics agrees with it ----------------------

QUEUE = 4  # with the tiny server's 8 running slots: 12 sequences admitted at most


@pytest.fixture(scope="module")
def held(tiny_target: Path, tiny_draft: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A tiny server whose engine holds inside its step (busy in torch) once a request has tokens,
    until told ``release``: aborts cannot reach the engine meanwhile, on a machine of any speed."""
    srv = ServerProcess(tiny_args(tiny_target, tiny_draft, "--max-queue", str(QUEUE)),
                        tmp_path_factory.mktemp("held") / "server.log", env={"HELD_STEP_AFTER": "1"},
                        entry=HELD_STEP_ENTRY)
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.send("release")
        assert srv.terminate(timeout=60) == 0


def gauges(url: str) -> tuple[float | None, float | None]:
    text = httpx.get(url + "/metrics", timeout=10).text
    return metric_value(text, "specdec_num_requests_running"), metric_value(text, "specdec_num_requests_waiting")


def test_clients_that_leave_release_admission_at_once(held: ServerProcess) -> None:
    """11 streams fill the queue behind one that holds the engine, then their clients leave. The
    old server counted them until the engine retired them (a step later: here never, while held)
    and answered the next request 429 "12 in flight" while /metrics said otherwise."""
    body = {"model": "tiny", "prompt": "Hello", "max_tokens": 400, "ignore_eos": True, "stream": True}
    with httpx.Client(base_url=held.url, timeout=60) as client:
        with client.stream("POST", C, json=body) as first:
            assert first.status_code == 200
            held.wait_log("held-step: holding")
            for _ in range(TINY_MAX_NUM_SEQS + QUEUE - 1):  # fill admission; each client then leaves
                with client.stream("POST", C, json=body) as leaving:
                    assert leaving.status_code == 200
            wait_until(lambda: held.logs().count("client_disconnected") >= TINY_MAX_NUM_SEQS + QUEUE - 1,
                       WAIT_S, "the server to see the clients leave")
            running, waiting = gauges(held.url)
            assert (running or 0) + (waiting or 0) == 1, (running, waiting)
            with client.stream("POST", C, json=body) as again:
                assert again.status_code == 200, again.read()[:300]
                running, waiting = gauges(held.url)
                assert (running or 0) + (waiting or 0) == 2, (running, waiting)
            held.send("release")
