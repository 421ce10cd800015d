"""CORS (``--allowed-origins``): a browser page on an allowed origin can call a real server, its
preflight needs no API key, and without the flag no CORS header is ever sent."""

from __future__ import annotations

import httpx

from tests.helpers.servers import KEYED_API_KEY as KEY
from tests.helpers.servers import KEYED_ORIGIN as ORIGIN
from tests.helpers.servers import ServerProcess

PREFLIGHT = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "authorization, content-type"}


def test_a_preflight_from_an_allowed_origin_is_answered_without_the_key(keyed_server: ServerProcess) -> None:
    r = httpx.options(keyed_server.url + "/v1/chat/completions", headers=PREFLIGHT)
    assert r.status_code == 200, r.text
    assert r.headers["access-control-allow-origin"] == ORIGIN
    assert set(r.headers["access-control-allow-methods"].replace(" ", "").split(",")) >= {"GET", "POST"}
    assert "authorization" in r.headers["access-control-allow-headers"].lower()


def test_the_real_request_carries_the_headers_and_still_needs_the_key(keyed_server: ServerProcess) -> None:
    ok = httpx.get(keyed_server.url + "/v1/models", headers={"Origin": ORIGIN, "Authorization": f"Bearer {KEY}"})
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == ORIGIN
    assert "x-request-id" in ok.headers["access-control-expose-headers"].lower()
    refused = httpx.get(keyed_server.url + "/v1/models", headers={"Origin": ORIGIN})
    assert refused.status_code == 401  # CORS does not open the API: the page can read why, no more
    assert refused.headers["access-control-allow-origin"] == ORIGIN


def test_other_origins_and_hosts_are_not_allowed(keyed_server: ServerProcess) -> None:
    r = httpx.options(keyed_server.url + "/v1/chat/completions", headers={**PREFLIGHT, "Origin": "http://evil.example"})
    assert r.status_code == 400 and "access-control-allow-origin" not in r.headers
    r = httpx.options(keyed_server.url + "/v1/chat/completions", headers={**PREFLIGHT, "Host": "evil.example"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_host"  # the Host check comes first


def test_without_the_flag_there_are_no_cors_headers(tiny_server: ServerProcess) -> None:
    r = httpx.options(tiny_server.url + "/v1/chat/completions", headers=PREFLIGHT)
    assert r.status_code == 405
    assert not [h for h in r.headers if h.lower().startswith("access-control-")]
    r = httpx.get(tiny_server.url + "/v1/models", headers={"Origin": ORIGIN})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
