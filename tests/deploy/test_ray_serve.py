"""``specdec serve-ray``: two replicas of the tiny models behind Ray Serve's HTTP proxy on
127.0.0.1, one Ray cluster for the whole module. The OpenAI SDK streams through the proxy, greedy
output equals a single ``specdec serve``, both replicas take requests, and killing one replica's
process fails only the streams it was serving while Ray brings it back."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from server.ray_serve import REPLICA_HEADER, RayScaling, deployment_options
from server.settings import ServerSettings
from tests.helpers.servers import ServerProcess, tiny_args

MODEL = "tiny"
MESSAGES = [{"role": "user", "content": "Tell me a story about a fox."}]
def replicas_ready(srv: ServerProcess) -> dict[str, int]:
    """Replica id -> pid, from the replicas' 'replica ready' JSON log lines, which Ray forwards to
    the driver's output behind a ``(ServeReplica:... pid=N)`` prefix."""
    found = {}
    for line in srv.logs().splitlines():
        if '"replica ready"' in line:
            event = json.loads(line[line.index("{"):])
            found[event["replica"]] = event["pid"]
    return found


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.2)


@pytest.fixture(scope="module")
def ray_server(tiny_target: Path, tiny_draft: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = ServerProcess(tiny_args(tiny_target, tiny_draft, "--num-replicas", "2", "--cpus-per-replica", "1"),
                        tmp_path_factory.mktemp("ray") / "server.log", command="serve-ray")
    try:
        srv.wait_ready(timeout=600)
        wait_for(lambda: len(replicas_ready(srv)) >= 2, 300, "two replicas ready")
        yield srv
    finally:
        code = srv.terminate(timeout=120)
        assert code == 0, srv.log_path.read_text(errors="replace")[-3000:]


def test_the_plain_server_never_imports_ray() -> None:
    code = "import sys, server.cli, server.app, server.runner; sys.exit('ray' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2]).returncode == 0


def test_deployment_options_follow_the_engine() -> None:
    settings = ServerSettings()
    settings.engine.max_num_seqs = 8
    cpu = deployment_options(settings, RayScaling(min_replicas=1, max_replicas=4), cuda_available=False, cpu_count=16)
    assert cpu["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 8.0}
    assert cpu["ray_actor_options"] == {"num_cpus": 4.0, "num_gpus": 0.0}
    assert cpu["max_ongoing_requests"] == 8 + settings.max_queue
    gpu = deployment_options(settings, RayScaling(num_replicas=2), cuda_available=True, cpu_count=16)
    assert gpu["num_replicas"] == 2 and "autoscaling_config" not in gpu
    assert gpu["ray_actor_options"] == {"num_cpus": 1.0, "num_gpus": 1.0}


def test_sdk_streams_through_the_proxy_and_matches_a_single_server(ray_server: ServerProcess, tiny_server: ServerProcess) -> None:
    kwargs = dict(model=MODEL, messages=MESSAGES, max_tokens=24, temperature=0)
    ray_client = openai.OpenAI(base_url=ray_server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    single = openai.OpenAI(base_url=tiny_server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    chunks = list(ray_client.chat.completions.create(stream=True, **kwargs))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1
    assert streamed == single.chat.completions.create(**kwargs).choices[0].message.content
    assert chunks[-1].model_extra["speculative"]["method"] != "none"  # the same report, through the proxy


def test_both_replicas_take_requests(ray_server: ServerProcess) -> None:
    seen: set[str] = set()
    with httpx.Client(base_url=ray_server.url, timeout=120) as http:
        for _ in range(8):  # a handful of concurrent waves; Ray spreads them over the replicas
            replies: list[httpx.Response] = []
            threads = [threading.Thread(target=lambda replies=replies: replies.append(http.post(
                "/v1/completions", json={"model": MODEL, "prompt": "Hello", "max_tokens": 4}))) for _ in range(4)]
            [t.start() for t in threads]
            [t.join() for t in threads]
            assert all(r.status_code == 200 for r in replies)
            seen |= {r.headers[REPLICA_HEADER] for r in replies}
            if len(seen) == 2:
                break
    assert len(seen) == 2, seen


def test_killing_a_replica_fails_only_its_streams_and_ray_restarts_it(ray_server: ServerProcess) -> None:
    before = replicas_ready(ray_server)
    results: dict[int, tuple] = {}
    streaming = threading.Semaphore(0)

    def stream(i: int) -> None:
        body = {"model": MODEL, "prompt": f"Story {i}:", "max_tokens": 400, "ignore_eos": True, "stream": True}
        replica, events = None, 0
        try:
            with httpx.stream("POST", ray_server.url + "/v1/completions", json=body, timeout=300) as r:
                replica = r.headers[REPLICA_HEADER]
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        events += 1
                        if events == 2:
                            streaming.release()
                        if line == "data: [DONE]":
                            results[i] = ("done", replica)
                            return
            results[i] = ("ended without [DONE]", replica)
        except httpx.HTTPError as exc:
            results[i] = ("broken", replica, type(exc).__name__)
        finally:
            if events < 2:
                streaming.release()

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(6)]
    [t.start() for t in threads]
    for _ in threads:  # every stream has produced tokens
        assert streaming.acquire(timeout=300)
    victim = next(iter(before))
    os.kill(before[victim], signal.SIGKILL)
    [t.join(300) for t in threads]
    assert len(results) == 6, results
    for outcome in results.values():
        assert (outcome[0] == "done") == (outcome[1] != victim), results
    assert any(o[1] == victim for o in results.values()) and any(o[1] != victim for o in results.values()), results
    # Ray starts a new replica in its place, and the endpoint answers from two replicas again.
    wait_for(lambda: len(set(replicas_ready(ray_server)) - set(before)) >= 1, 300, "a replacement replica")
    fresh = set(replicas_ready(ray_server)) - set(before)
    with httpx.Client(base_url=ray_server.url, timeout=120) as http:
        def answered_by_fresh() -> bool:
            r = http.post("/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 2})
            return r.status_code == 200 and r.headers[REPLICA_HEADER] in fresh
        wait_for(answered_by_fresh, 300, "a request served by the replacement replica")
