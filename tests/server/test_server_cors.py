"""CORS (``--allowed-origins``): a browser page on an allowed origin can call a real server, its
preflight needs no API key, and without the flag no CORS header is ever sent."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.helpers.servers import ServerProcess, serving, tiny_args

ORIGIN = "http://app.example:3000"
KEY = "cors-test-key"
PREFLIGHT = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "authorization, content-type"}


@pytest.fixture(scope="module")
def cors_server(tiny_target: Path, tiny_draft: Path, tmp_path_factory: pytest.TempPathFactory):
    args = tiny_args(tiny_target, tiny_draft, "--allowed-origins", f"{ORIGIN},http://other.example",
                     "--allowed-methods", "GET,POST", "--api-key", KEY)
    with serving(ServerProcess(args, tmp_path_factory.mktemp("cors") / "server.log")) as srv:
        yield srv


def test_a_preflight_from_an_allowed_origin_is_answered_without_the_key(cors_server: ServerProcess) -> None:
    r = httpx.options(cors_server.url + "/v1/chat/completions", headers=PREFLIGHT)
    assert r.status_code == 200, r.text
    assert r.headers["access-control-allow-origin"] == ORIGIN
    assert set(r.headers["access-control-allow-methods"].replace(" ", "").split(",")) >= {"GET", "POST"}
    assert "authorization" in r.headers["access-control-allow-headers"].lower()


def test_the_real_request_carries_the_headers_and_still_needs_the_key(cors_server: ServerProcess) -> None:
    ok = httpx.get(cors_server.url + "/v1/models", headers={"Origin": ORIGIN, "Authorization": f"Bearer {KEY}"})
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == ORIGIN
    assert "x-request-id" in ok.headers["access-control-expose-headers"].lower()
    refused = httpx.get(cors_server.url + "/v1/models", headers={"Origin": ORIGIN})
    assert refused.status_code == 401  # CORS does not open the API: the page can read why, no more
    assert refused.headers["access-control-allow-origin"] == ORIGIN


def test_other_origins_and_hosts_are_not_allowed(cors_server: ServerProcess) -> None:
    r = httpx.options(cors_server.url + "/v1/chat/completions", headers={**PREFLIGHT, "Origin": "http://evil.example"})
    assert r.status_code == 400 and "access-control-allow-origin" not in r.headers
    r = httpx.options(cors_server.url + "/v1/chat/completions", headers={**PREFLIGHT, "Host": "evil.example"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_host"  # the Host check comes first


def test_without_the_flag_there_are_no_cors_headers(tiny_server: ServerProcess) -> None:
    r = httpx.options(tiny_server.url + "/v1/chat/completions", headers=PREFLIGHT)
    assert r.status_code == 405
    assert not [h for h in r.headers if h.lower().startswith("access-control-")]
    r = httpx.get(tiny_server.url + "/v1/models", headers={"Origin": ORIGIN})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
