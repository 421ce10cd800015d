"""Issue 20, the HTTP edge: no request smuggling, absolute-form targets, probes that survive
connection floods and Host allow-lists, a per-client connection cap, and echoed values cut short.

Raw HTTP over sockets, to 127.0.0.1 only (the flood's sockets come from other loopback addresses,
127.0.0.2 and up, so that the server sees several clients). Every wait is bounded; timings are
asserted only against the /health budget (``HealthPoller.assert_within_budget``), with floods sized so the old code failed every
/health poll outright.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.raw_http import WAIT_S, HealthPoller, closed_by_server, connect, exchange, read_answer, request
from tests.helpers.servers import ServerProcess, serving, tiny_args

C = "/v1/completions"
LIMIT, PER_CLIENT = 48, 16
HOSTS = "127.0.0.1,api.example.test"


@pytest.fixture(scope="module")
def guarded(tiny_target: Path, tiny_draft: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with serving(ServerProcess(
        [*tiny_args(tiny_target, tiny_draft), "--header-timeout", "60", "--keep-alive-timeout", "600",
         "--limit-concurrency", str(LIMIT), "--max-connections-per-client", str(PER_CLIENT),
         "--allowed-hosts", HOSTS],
        tmp_path_factory.mktemp("guarded") / "server.log",
    )) as srv:
        yield srv


def connect_from(address: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(WAIT_S)
    sock.bind((address, 0))
    sock.connect(("127.0.0.1", port))
    return sock


# -- request smuggling ---------------------------------------------------------------------------


def test_content_length_with_chunked_is_a_400_and_the_connection_closes(guarded: ServerProcess) -> None:
    """RFC 9112 6.3: a request with both framings is refused and its connection closed; the old
    server answered it by the chunked framing and kept the connection for the smuggled request."""
    body = json.dumps({"model": "tiny", "prompt": "Hi", "max_tokens": 1}).encode()
    smuggled = request("GET", "/v1/models")
    chunked = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    with connect(guarded.port) as sock:
        sock.sendall(request("POST", C, chunked + smuggled, content_type="application/json",
                             content_length=str(len(body)), transfer_encoding="chunked"))
        answer = read_answer(sock)
        answer.error(400, "invalid_http")
        assert answer.headers.get("connection") == "close"
        assert closed_by_server(sock)  # the smuggled request is never answered


# -- absolute-form targets and the Host allow-list ------------------------------------------------


def test_absolute_form_targets_are_served_and_their_host_checked(guarded: ServerProcess) -> None:
    port = guarded.port
    answer = exchange(port, request("GET", f"http://127.0.0.1:{port}/v1/models"))
    assert answer.status == 200 and json.loads(answer.body)["data"][0]["id"] == "tiny", answer.body[:200]
    assert exchange(port, request("GET", "http://api.example.test/health")).status == 200
    exchange(port, request("GET", "http://attacker.example/v1/models")).error(400, "invalid_host")


def test_probes_answer_whatever_the_host(guarded: ServerProcess) -> None:
    """Kubernetes probes send the pod IP as Host: /health and /metrics must answer it."""
    for path in ("/health", "/metrics", "/health/"):
        assert exchange(guarded.port, request("GET", path, host="10.1.2.3:8000")).status == 200, path
    exchange(guarded.port, request("GET", "/v1/models", host="10.1.2.3:8000")).error(400, "invalid_host")


def test_a_huge_model_name_is_not_echoed_whole(guarded: ServerProcess) -> None:
    body = json.dumps({"model": "m" * 1_000_000, "prompt": "Hi", "max_tokens": 1}).encode()
    answer = exchange(guarded.port, request("POST", C, body, content_type="application/json",
                                            content_length=str(len(body))))
    err = answer.error(404, "model_not_found")
    assert err["param"] == "model" and len(err["message"]) < 300, len(err["message"])


# -- connection floods ----------------------------------------------------------------------------


def test_one_clients_flood_is_capped_and_health_stays_up(guarded: ServerProcess) -> None:
    """127.0.0.2 opens 10x its share of idle sockets: beyond the cap each is answered 503 and closed
    at once, the others stay open, and /health from another address answers within 100 ms."""
    held: list[socket.socket] = []
    refused = 0
    with HealthPoller(guarded.port) as poller:
        try:
            for _ in range(10 * PER_CLIENT):
                sock = connect_from("127.0.0.2", guarded.port)
                held.append(sock)
            for sock in held[PER_CLIENT:]:
                read_answer(sock).error(503, "too_many_connections")
                assert closed_by_server(sock)
                refused += 1
            assert exchange(guarded.port, request("GET", "/v1/models")).status == 200
        finally:
            for sock in held:
                sock.close()
    assert refused == 9 * PER_CLIENT
    assert poller.statuses and set(poller.statuses) == {200}, set(poller.statuses)
    poller.assert_within_budget()


def test_probes_pass_the_connection_limit(guarded: ServerProcess) -> None:
    """Idle sockets from several clients fill --limit-concurrency: requests get 503, /health and
    /metrics still answer (the old server refused them too, and Kubernetes restarted the pod)."""
    held = [connect_from(f"127.0.0.{2 + i // PER_CLIENT}", guarded.port) for i in range(LIMIT + PER_CLIENT)]
    try:
        exchange(guarded.port, request("GET", "/v1/models")).error(503, "too_many_connections")
        with HealthPoller(guarded.port) as poller:
            for path in ("/health", "/metrics"):
                assert exchange(guarded.port, request("GET", path)).status == 200, path
            time.sleep(0.5)
    finally:
        for sock in held:
            sock.close()
    assert poller.statuses and set(poller.statuses) == {200}, set(poller.statuses)
    poller.assert_within_budget()
