"""Issue 20, body parsing: a body is refused by its JSON shape before pydantic parses it (parsing
holds the GIL for the whole body), the count is exact outside strings, and /health answers within
100 ms while maximal bodies arrive. A real tiny server on 127.0.0.1; every wait bounded; the only
timing asserted is the /health budget (``HealthPoller.assert_within_budget``), with bodies that held the old server 1-5 s each."""

from __future__ import annotations

import json
import random
import threading

import httpx
import pytest

from server.http import json_shape as shape_module
from server.http.json_shape import json_shape
from tests.helpers.raw_http import HealthPoller
from tests.helpers.servers import ServerProcess

C = "/v1/completions"
WAIT_S = 120.0
BODY_MAX = 8 * 1024 * 1024
P = '{"model":"tiny","prompt":"x","max_tokens":1,'


def filled(prefix: str, unit: str, suffix: str) -> bytes:
    """``prefix`` + as many ``unit``s as fit in 8 MiB + ``suffix`` (``unit`` ends with a comma)."""
    count = (BODY_MAX - len(prefix) - len(suffix) - 16) // len(unit)
    return (prefix + (unit * count)[:-1] + suffix).encode()


def post(url: str, raw: bytes) -> httpx.Response:
    return httpx.post(url + C, content=raw, headers={"content-type": "application/json"}, timeout=WAIT_S)


def reference_shape(raw: bytes) -> tuple[int, int]:
    """Containers and commas outside strings, by a character-by-character walk."""
    containers = values = 0
    inside = escaped = False
    for ch in raw.decode():
        if inside:
            escaped, inside = (False, True) if escaped else (ch == "\\", ch != '"')
        elif ch == '"':
            inside = True
        elif ch in "[{:":
            containers += 1
        elif ch == ",":
            values += 1
    return containers, values


@pytest.mark.parametrize("chunk", [2, 4, 6, 64, shape_module.CHUNK_BYTES])
def test_the_shape_is_counted_outside_strings_whatever_the_chunks(monkeypatch: pytest.MonkeyPatch, chunk: int) -> None:
    """Escaped quotes and backslashes, brackets inside strings, chunk edges anywhere."""
    monkeypatch.setattr(shape_module, "CHUNK_BYTES", chunk)
    atoms = ['a"b', "\\", '\\\\"', "[,{:}]", 1, {'k\\"': [1, 2]}, [], '\\"\\\\', "\\\\\\\\\\"]
    rng = random.Random(chunk)
    for _ in range(400):
        raw = json.dumps([rng.choice(atoms) for _ in range(rng.randint(0, 9))]).encode()
        found = json_shape(raw)
        assert (found.containers, found.values) == reference_shape(raw), raw


@pytest.mark.parametrize(("raw", "flag"), [
    (filled(P + '"junk":[', "[],", "]}"), "--max-body-containers"),  # held the GIL 4.8 s
    (filled(P + '"junk":{', '"k":0,', "}}"), "--max-body-containers"),
    (filled('{"model":"tiny","max_tokens":1,"prompt":[', "1,", "]}"), "--max-body-values"),
], ids=["empty-arrays", "keys", "token-ids"])  # ids: the 8 MB bodies would become the test's name
def test_a_body_over_the_shape_limits_is_a_400_before_parsing(tiny_server: ServerProcess, raw: bytes, flag: str) -> None:
    out = post(tiny_server.url, raw)
    assert out.status_code == 400, out.text[:300]
    err = out.json()["error"]
    assert err["code"] == "limit_exceeded" and flag in err["message"], err


def test_brackets_and_commas_inside_strings_do_not_count(tiny_server: ServerProcess) -> None:
    """20,000 characters of '[{:,' in the prompt text: 20,000 of each, none of them structure."""
    out = httpx.post(tiny_server.url + C, json={"model": "tiny", "prompt": "[{:," * 5000, "max_tokens": 1}, timeout=WAIT_S)
    assert out.status_code in (200, 400), out.text[:300]
    assert out.json().get("error", {}).get("code") != "limit_exceeded", out.text[:300]


def test_health_answers_within_100_ms_while_maximal_bodies_arrive(tiny_server: ServerProcess) -> None:
    """Two clients each send three 8 MB bodies of the worst shapes (1-5 s of GIL each on the old
    server, which parsed them whole); /health, polled meanwhile, keeps its budget."""
    bodies = [filled(P + '"junk":[', "[],", "]}"), filled(P + '"junk":{', '"k":0,', "}}"),
              filled(P + '"junk":[', "0,", "]}")]
    statuses: list[int] = []

    def client() -> None:
        for raw in bodies:
            statuses.append(post(tiny_server.url, raw).status_code)

    with HealthPoller(tiny_server.port) as poller:
        threads = [threading.Thread(target=client) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT_S)
    assert statuses == [400] * 6, statuses
    assert poller.statuses and set(poller.statuses) == {200}, set(poller.statuses)
    poller.assert_within_budget()
