"""Issue 13, the HTTP edge: every error an OpenAI error object with ``x-request-id``, read timeouts,
a connection limit, a Host allow-list, JSON-only bodies, no Host-built redirects, no 500 for odd
values or for clients that leave mid-body, and no empty API key.

Most cases speak raw HTTP over a socket: the point is what the server does with requests no
well-behaved client library would send. ``edge`` is a server with short read timeouts, a low
connection limit and an explicit ``--allowed-hosts``; the shared tiny server has the defaults.
Every wait is on an event (an answer, a closed socket, a counter), bounded only to never hang.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from server.app import build_app
from server.cli import parse_serve_args, settings_from_args
from server.http.host_check import host_allowed
from server.settings import ServerSettings
from tests.helpers.raw_http import WAIT_S, Answer, closed_by_server, connect, exchange, read_answer, request
from tests.helpers.servers import REPO_ROOT, FakeEngine, ServerProcess, ThreadServer, metric_value, serving, tiny_args, wait_until

C, CHAT = "/v1/completions", "/v1/chat/completions"
P = {"model": "tiny", "prompt": "Hello", "max_tokens": 2}
M = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
EDGE_HEADER_TIMEOUT = EDGE_BODY_TIMEOUT = 2
EDGE_MAX_CONNECTIONS = 8
EDGE_HOSTS = "127.0.0.1,api.example.test"


@pytest.fixture(scope="module")
def edge(tiny_target: Path, tiny_draft: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with serving(ServerProcess(
        [
            *tiny_args(tiny_target, tiny_draft),
            "--header-timeout", str(EDGE_HEADER_TIMEOUT), "--body-timeout", str(EDGE_BODY_TIMEOUT),
            # Long enough that only the behaviour under test ever closes a connection.
            "--keep-alive-timeout", "600",
            "--limit-concurrency", str(EDGE_MAX_CONNECTIONS), "--allowed-hosts", EDGE_HOSTS,
        ],
        tmp_path_factory.mktemp("edge") / "server.log",
    )) as srv:
        yield srv


def http_count(url: str, route: str, status: int) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    return metric_value(text, f'specdec_http_requests_total{{route="{route}",status="{status}"}}') or 0.0


# -- finding 3 and 9: odd values are 400s that say what is wrong ------------------------------------

ODD_VALUES = [
    ("role-object", CHAT, {**M, "messages": [{"role": {}, "content": "hi"}]}, "messages[0].role"),
    ("role-array", CHAT, {**M, "messages": [{"role": ["user"], "content": "hi"}]}, "messages[0].role"),
    ("part-type-object", CHAT, {**M, "messages": [{"role": "user", "content": [{"type": {}, "text": "x"}]}]},
     "messages[0].content[0].type"),
    ("name-object", CHAT, {**M, "messages": [{"role": "user", "content": "hi", "name": {}}]}, "messages[0].name"),
    ("tool-choice-object", CHAT, {**M, "tool_choice": {"type": {}}}, "tool_choice"),
    ("response-format-type-object", CHAT, {**M, "response_format": {"type": {}}}, "response_format.type"),
    ("stop-object", C, {**P, "stop": [{}]}, "stop"),
    ("logit-bias-object", C, {**P, "logit_bias": {"1": {}}}, "logit_bias.1"),
    ("model-object", C, {**P, "model": {}}, "model"),
    ("user-array", CHAT, {**M, "user": ["x"]}, "user"),
]
HUGE = 2**64
HUGE_INTEGERS = [
    ("max-tokens", C, {**P, "max_tokens": HUGE}, "max_tokens"),
    ("seed", C, {**P, "seed": HUGE}, "seed"),
    ("n", CHAT, {**M, "n": HUGE}, "n"),
    ("top-k", C, {**P, "top_k": HUGE}, "top_k"),
    ("stop-token-ids", C, {**P, "stop_token_ids": [HUGE]}, "stop_token_ids[0]"),
    ("max-completion-tokens", CHAT, {**M, "max_completion_tokens": HUGE}, "max_completion_tokens"),
]


@pytest.mark.parametrize("case", ODD_VALUES, ids=[c[0] for c in ODD_VALUES])
def test_unhashable_values_are_400_not_500(tiny_server: ServerProcess, case: tuple) -> None:
    _, path, body, param = case
    answer = exchange(tiny_server.port, request("POST", path, json.dumps(body).encode(), content_type="application/json",
                                                content_length=str(len(json.dumps(body)))))
    assert answer.error(400)["param"] == param


@pytest.mark.parametrize("case", HUGE_INTEGERS, ids=[c[0] for c in HUGE_INTEGERS])
def test_integers_beyond_int64_name_the_range(tiny_server: ServerProcess, case: tuple) -> None:
    _, path, body, param = case
    r = httpx.post(tiny_server.url + path, json=body, timeout=30)
    err = Answer(r.status_code, dict(r.headers), r.content).error(400)
    assert err["param"] == param
    assert str(HUGE) in err["message"] and "must be <=" in err["message"], err["message"]
    assert "number" not in err["message"] and "e+19" not in err["message"]


# -- finding 5: a client gone mid-body is a disconnect, not a server error ---------------------------


def test_client_leaving_mid_body_is_logged_as_499_not_500(edge: ServerProcess) -> None:
    before = {s: http_count(edge.url, C, s) for s in (499, 500)}
    with connect(edge.port) as sock:
        sock.sendall(request("POST", C, b'{"prompt": "Hel', content_type="application/json", content_length="100"))
    wait_until(lambda: any(http_count(edge.url, C, s) > before[s] for s in (499, 500)), WAIT_S, "the request to be logged")
    assert http_count(edge.url, C, 500) == before[500]
    assert http_count(edge.url, C, 499) == before[499] + 1
    logs = [json.loads(line) for line in edge.logs().splitlines() if line.startswith("{")]
    assert not [e for e in logs if e.get("level") in ("error", "critical")], "a client leaving is no server error"
    gone = [e for e in logs if e.get("event") == "request" and e.get("status") == 499]
    assert gone and gone[-1]["level"] == "info" and gone[-1]["client_disconnected"] is True


# -- finding 6 and the rest: every HTTP error is an error object with x-request-id -------------------

JSON_HEADERS = {"content_type": "application/json"}
RAW_ERRORS = [
    ("413-declared-length", request("POST", C, content_type="application/json", content_length=str(64 * 2**20)),
     413, "request_too_large"),
    ("404-route", request("GET", "/v1/nothing"), 404, None),
    ("405-method", request("GET", C), 405, None),
    ("400-malformed-json", request("POST", C, b'{"prompt": ', content_length="11", **JSON_HEADERS), 400, None),
    ("400-not-http", b"HELLO THERE\r\n\r\n", 400, "invalid_http"),
    ("400-bad-header", b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nno colon here\r\n\r\n", 400, "invalid_http"),
    ("400-foreign-host", request("GET", "/v1/models", host="rebound.attacker.example:8000"), 400, "invalid_host"),
    ("415-text-plain", request("POST", C, b'{"prompt": "hi"}', content_type="text/plain", content_length="16"),
     415, "unsupported_media_type"),
    ("415-form", request("POST", C, b"prompt=hi", content_type="application/x-www-form-urlencoded", content_length="9"),
     415, "unsupported_media_type"),
    ("415-no-type", request("POST", C, b'{"prompt": "hi"}', content_length="16"), 415, "unsupported_media_type"),
]


@pytest.mark.parametrize("case", RAW_ERRORS, ids=[c[0] for c in RAW_ERRORS])
def test_http_errors_are_error_objects_with_request_id(edge: ServerProcess, case: tuple) -> None:
    _, data, status, code = case
    exchange(edge.port, data).error(status, code)


def test_413_closes_the_connection_without_reading_the_body(edge: ServerProcess) -> None:
    with connect(edge.port) as sock:
        sock.sendall(request("POST", C, b"{", content_type="application/json", content_length=str(64 * 2**20)))
        read_answer(sock).error(413, "request_too_large")
        assert closed_by_server(sock)


def test_upload_answered_early_is_not_reset(edge: ServerProcess) -> None:
    """After a 413 the client may still be uploading: the server stops writing but keeps reading
    (and discarding) instead of closing, which would answer the upload with a connection reset."""
    with connect(edge.port) as sock:
        sock.sendall(request("POST", C, b"{", content_type="application/json", content_length=str(64 * 2**20)))
        read_answer(sock).error(413, "request_too_large")
        assert closed_by_server(sock)  # end of stream for reading...
        for _ in range(128):  # ...while 8 MiB more of the body are still accepted, without a reset
            sock.sendall(b"x" * 65536)


def test_json_with_parameters_and_json_suffix_types_are_accepted(edge: ServerProcess) -> None:
    for content_type in ("application/json; charset=utf-8", "Application/JSON", "application/vnd.api+json"):
        r = httpx.post(edge.url + C, content=json.dumps(P), headers={"content-type": content_type}, timeout=30)
        assert r.status_code == 200, (content_type, r.text)


def test_unexpected_failure_500_carries_the_request_id(smol_tokenizer_dir: Path) -> None:
    """A bug (here: a tokenizer that raises) is a generic 500 whose id matches the log's."""
    from transformers import AutoTokenizer

    class Broken:
        def __getattr__(self, name: str):
            raise RuntimeError("broken tokenizer")

    fake = FakeEngine(AutoTokenizer.from_pretrained(smol_tokenizer_dir))
    fake.tokenizer = Broken()
    app = build_app(ServerSettings(served_model_name="fake"), engine_factory=lambda cfg: fake)
    with ThreadServer(app) as srv:
        srv.wait_for(lambda: httpx.get(srv.url + "/health").status_code == 200)
        r = httpx.post(srv.url + C, json={"model": "fake", "prompt": "hi", "max_tokens": 2}, timeout=30)
    err = Answer(r.status_code, {k.lower(): v for k, v in r.headers.items()}, r.content).error(500, "internal_error")
    assert r.headers["x-request-id"] in err["message"]


# -- finding 7: read timeouts and the connection limit -----------------------------------------------


def test_slow_request_heads_get_408_and_are_closed(edge: ServerProcess) -> None:
    slow = [connect(edge.port) for _ in range(EDGE_MAX_CONNECTIONS - 2)]
    silent = connect(edge.port)
    try:
        for i, sock in enumerate(slow):
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + str(i).encode())
        for sock in slow:
            read_answer(sock).error(408, "request_timeout")
            assert closed_by_server(sock)
        assert closed_by_server(silent), "a connection that never sends a byte is closed too"
    finally:
        for sock in [*slow, silent]:
            sock.close()


def test_head_timeout_applies_to_the_next_request_on_a_kept_alive_connection(edge: ServerProcess) -> None:
    with connect(edge.port) as sock:
        sock.sendall(request("GET", "/health"))
        assert read_answer(sock).status == 200
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # and never the blank line
        read_answer(sock).error(408, "request_timeout")


def test_slow_body_gets_408(edge: ServerProcess) -> None:
    with connect(edge.port) as sock:
        sock.sendall(request("POST", C, b'{"prompt": "He', content_type="application/json", content_length="100"))
        err = read_answer(sock).error(408, "request_timeout")
        assert f"{EDGE_BODY_TIMEOUT} s" in err["message"]
        assert closed_by_server(sock)


def test_body_nobody_reads_is_not_drained_forever(edge: ServerProcess) -> None:
    """A route that answers without reading the body (here /health): the rest of a body still on
    its way would otherwise be read and discarded for as long as the client keeps sending."""
    with connect(edge.port) as sock:
        sock.sendall(request("GET", "/health", b"12345", content_length="1000000"))
        assert read_answer(sock).status == 200
        assert closed_by_server(sock)


def test_connections_beyond_the_limit_get_503_until_some_close(edge: ServerProcess) -> None:
    held = []
    try:
        for _ in range(EDGE_MAX_CONNECTIONS):  # kept alive after one request each
            sock = connect(edge.port)
            sock.sendall(request("GET", "/health"))
            assert read_answer(sock).status == 200
            held.append(sock)
        answer = exchange(edge.port, request("GET", "/v1/models"))
        answer.error(503, "too_many_connections")
        assert answer.headers["retry-after"] == "1"
    finally:
        for sock in held:
            sock.close()
    wait_until(lambda: httpx.get(edge.url + "/v1/models", timeout=10).status_code == 200, WAIT_S, "the limit to clear")


# -- finding 9: Host allow-list, redirects, empty API key ---------------------------------------------


def test_default_allow_list_on_loopback_refuses_foreign_hosts(tiny_server: ServerProcess) -> None:
    port = tiny_server.port
    exchange(port, request("GET", "/v1/models", host=f"attacker.example:{port}")).error(400, "invalid_host")
    exchange(port, request("POST", C, json.dumps(P).encode(), host="attacker.example", content_type="application/json",
                           content_length=str(len(json.dumps(P))))).error(400, "invalid_host")
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "LOCALHOST."):
        assert exchange(port, request("GET", "/v1/models", host=host)).status == 200, host


def test_allowed_hosts_flag(edge: ServerProcess) -> None:
    assert exchange(edge.port, request("GET", "/v1/models", host="api.example.test:443")).status == 200
    assert exchange(edge.port, request("GET", "/v1/models", host="127.0.0.1")).status == 200
    for host in ("localhost", "v2.api.example.test", "api.example.test.attacker.example"):
        exchange(edge.port, request("GET", "/v1/models", host=host)).error(400, "invalid_host")


def test_allow_list_defaults_and_patterns() -> None:
    assert ServerSettings(host="0.0.0.0").host_allowlist is None  # reached under names it cannot know
    assert ServerSettings(host="::").host_allowlist is None
    assert ServerSettings(host="127.0.0.1").host_allowlist == {"localhost", "127.0.0.1", "::1"}
    assert "127.0.0.2" in ServerSettings(host="127.0.0.2").host_allowlist
    assert ServerSettings(host="::1").host_allowlist == {"localhost", "127.0.0.1", "::1"}
    assert ServerSettings(host="127.0.0.1", allowed_hosts="*").host_allowlist is None
    allowed = ServerSettings(allowed_hosts="API.example.com., *.svc.local").host_allowlist
    assert allowed == {"api.example.com", "*.svc.local"}
    assert host_allowed("a.svc.local", allowed) and host_allowed("api.example.com", allowed)
    assert not host_allowed("svc.local", allowed) and not host_allowed("evilsvc.local", allowed)


@pytest.mark.parametrize("method,path", [("GET", "/health/"), ("GET", "/v1/models/"), ("POST", C + "/"), ("POST", CHAT + "//")])
def test_trailing_slash_is_served_not_redirected(tiny_server: ServerProcess, method: str, path: str) -> None:
    body = json.dumps(P if path.startswith(C) else M).encode() if method == "POST" else b""
    headers = {"content_type": "application/json", "content_length": str(len(body))} if body else {}
    answer = exchange(tiny_server.port, request(method, path, body, host=f"localhost:{tiny_server.port}", **headers))
    assert answer.status == 200, answer.body[:300]
    assert "location" not in answer.headers
    if path.startswith("/v1/models"):
        assert json.loads(answer.body)["object"] == "list"


@pytest.mark.parametrize("argv,env", [(["serve", "--api-key", ""], {}), (["serve"], {"SPECDEC_API_KEY": ""}),
                                      (["serve", "--api-key", "  "], {}), (["serve"], {"SPECDEC_API_KEY": "key\n"})])
def test_empty_or_padded_api_key_is_refused(argv: list[str], env: dict) -> None:
    with pytest.raises(SystemExit, match="API key"):
        settings_from_args(parse_serve_args(argv, env=env), env=env)


def test_empty_api_key_variable_stops_the_server_at_start() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "server", "serve", "--port", "0"], cwd=REPO_ROOT, capture_output=True, text=True,
        env={**os.environ, "SPECDEC_API_KEY": ""}, timeout=WAIT_S, check=False,
    )
    assert out.returncode != 0
    assert "API key is empty" in out.stderr


def test_edge_flags_reach_the_settings() -> None:
    env = {"SPECDEC_HEADER_TIMEOUT": "3", "SPECDEC_ALLOWED_HOSTS": "a.example"}
    s = settings_from_args(parse_serve_args(
        ["serve", "--body-timeout", "7", "--keep-alive-timeout", "9", "--limit-concurrency", "11"], env=env), env=env)
    assert (s.header_timeout, s.body_timeout, s.keep_alive_timeout, s.limit_concurrency) == (3, 7, 9, 11)
    assert s.host_allowlist == {"a.example"}
    defaults = settings_from_args(parse_serve_args(["serve"], env={}), env={})
    assert (defaults.header_timeout, defaults.body_timeout, defaults.keep_alive_timeout) == (10, 60, 5)
    assert defaults.limit_concurrency == 512


def test_metrics_expose_process_memory(edge: ServerProcess) -> None:
    """Server memory and open descriptors are scrapeable (the soak reads them for a --url server)."""
    text = httpx.get(edge.url + "/metrics", timeout=10).text
    assert (metric_value(text, "process_resident_memory_bytes") or 0) > 0
    assert (metric_value(text, "process_open_fds") or 0) > 0
