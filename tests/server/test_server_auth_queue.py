"""``--api-key`` (set through SPECDEC_API_KEY) and ``--max-queue`` on one strict server."""

from __future__ import annotations

import concurrent.futures
import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.helpers.servers import ServerProcess, metric_value, parse_sse, tiny_args

KEY = "sk-test-3f9c2a7e51d04b8c"
MAX_NUM_SEQS, MAX_QUEUE = 2, 1


@pytest.fixture(scope="module")
def strict_server(tiny_target: Path, tiny_draft: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    args = tiny_args(tiny_target, tiny_draft)
    args[args.index("--max-num-seqs") + 1] = str(MAX_NUM_SEQS)
    srv = ServerProcess(
        [*args, "--max-queue", str(MAX_QUEUE)],
        tmp_path_factory.mktemp("strict") / "server.log",
        env={"SPECDEC_API_KEY": KEY},
    )
    try:
        srv.wait_ready()
        yield srv
    finally:
        rc = srv.terminate(timeout=20)
    assert rc == 0, "SIGTERM on an idle server must exit 0"


def auth(key: str = KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.mark.parametrize(
    "headers",
    [{}, auth("wrong"), {"Authorization": KEY}, {"Authorization": f"Basic {KEY}"}, auth(KEY + "x")],
    ids=["missing", "wrong", "no-scheme", "basic", "prefix-match"],
)
def test_v1_requires_key(strict_server: ServerProcess, headers: dict) -> None:
    for method, path in (("GET", "/v1/models"), ("POST", "/v1/completions"), ("POST", "/v1/chat/completions")):
        r = httpx.request(method, strict_server.url + path, headers=headers, json={"prompt": "hi"}, timeout=10)
        assert r.status_code == 401, (path, r.text)
        err = r.json()["error"]
        assert err["code"] == "invalid_api_key" and err["type"] == "invalid_request_error"
        assert KEY not in r.text


def test_right_key_works_and_health_is_open(strict_server: ServerProcess) -> None:
    client = openai.OpenAI(base_url=strict_server.url + "/v1", api_key=KEY, max_retries=0)
    assert client.models.list().data[0].id == "tiny"
    out = client.completions.create(model="tiny", prompt="Hello", max_tokens=4, temperature=0)
    assert out.choices[0].finish_reason in ("stop", "length")
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=strict_server.url + "/v1", api_key="nope", max_retries=0).models.list()
    assert httpx.get(strict_server.url + "/health").status_code == 200
    assert httpx.get(strict_server.url + "/metrics").status_code == 200


def test_key_never_logged(strict_server: ServerProcess) -> None:
    httpx.get(strict_server.url + "/v1/models", headers=auth())
    httpx.get(strict_server.url + "/v1/models", headers=auth("wrong-" + KEY))
    time.sleep(0.3)
    assert KEY not in strict_server.logs()


def _long_stream(url: str) -> tuple[str, int]:
    body = {
        "model": "tiny", "prompt": "Keep going:", "max_tokens": 200, "temperature": 0,
        "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
    }
    r = httpx.post(url + "/v1/completions", json=body, headers=auth(), timeout=120)
    chunks = [json.loads(e) for e in parse_sse(r.text)[:-1]]
    finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    return finish[0], chunks[-1]["usage"]["completion_tokens"]


def test_queue_full_gets_429_and_admitted_requests_complete(strict_server: ServerProcess) -> None:
    url = strict_server.url
    capacity = MAX_NUM_SEQS + MAX_QUEUE

    def in_engine() -> float:
        text = httpx.get(url + "/metrics").text
        return metric_value(text, "specdec_num_requests_running") + metric_value(text, "specdec_num_requests_waiting")

    with concurrent.futures.ThreadPoolExecutor(capacity) as pool:
        admitted = [pool.submit(_long_stream, url) for _ in range(capacity)]
        deadline = time.monotonic() + 30
        while in_engine() < capacity:
            assert time.monotonic() < deadline, "admitted requests never filled the engine"
            time.sleep(0.02)
        rejected = httpx.post(
            url + "/v1/completions", json={"model": "tiny", "prompt": "one more", "max_tokens": 4}, headers=auth()
        )
        assert rejected.status_code == 429, rejected.text
        assert int(rejected.headers["retry-after"]) >= 1
        err = rejected.json()["error"]
        assert err["code"] == "queue_full" and "retry" in err["message"].lower()
        with pytest.raises(openai.RateLimitError):
            openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0).chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
        results = [f.result(timeout=120) for f in admitted]
    # Nothing admitted was lost: every stream ran to its full length.
    assert results == [("length", 200)] * capacity
    # With the queue drained, requests are admitted again.
    ok = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "now", "max_tokens": 2}, headers=auth())
    assert ok.status_code == 200
