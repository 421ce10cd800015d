"""Locust load test: users that stream /v1/completions and record TTFT and inter-token latency.

Headless, bounded run against a local server (4 users, spawned 2 per second, for 3 minutes: the
default pair on a 2-core CPU needs that long for streams to end; 30 s is enough for SmolLM2):

    locust -f clients/examples/locustfile.py --headless -u 4 -r 2 -t 3m --host http://127.0.0.1:8000

Besides the ordinary ``POST /v1/completions (stream)`` entry (time until the response headers
arrive, recorded when the stream ends), each streamed request fires custom events with
request_type ``SSE``:

- ``time_to_first_token``: from sending the request to the first chunk with text (ms), fired when
  that chunk arrives;
- ``inter_token_latency``: one event per gap between two consecutive text chunks (ms), fired as
  each chunk arrives. A chunk may carry several tokens when drafts were accepted, so this is the
  latency a streaming client sees;
- ``time_per_output_token``: (last chunk - first chunk) / (completion tokens - 1), one per request;
- ``stream_total``: the whole stream, with the completion token count as response length.

The first two are recorded as the chunks arrive, not when the stream ends, so even a run shorter
than one whole stream (a slow CPU, long outputs) shows them; the last two and the request entry
need finished streams.

A stream that ends without ``data: [DONE]``, carries an error event or returns a non-200 status is
reported as a failure. Environment knobs: ``SPECDEC_API_KEY`` (Bearer token), ``SPECDEC_MODEL``
(default: the first model in /v1/models), ``SPECDEC_MAX_TOKENS`` (default 64),
``SPECDEC_TEMPERATURE`` (default 0), ``SPECDEC_PROMPT_KINDS`` (comma list from clients/prompts.json:
``code_edit,open``), ``SPECDEC_SPECULATIVE`` (``0`` sends the per-request ``speculative: false``).
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path

import httpx
from httpx_sse import EventSource
from locust import HttpUser, between, task

PROMPTS_FILE = Path(__file__).resolve().parents[1] / "prompts.json"


def load_prompts(kinds: list[str]) -> list[str]:
    data = json.loads(PROMPTS_FILE.read_text())
    prompts: list[str] = []
    for kind in kinds:
        if kind == "chat":
            continue  # chat message lists are for /v1/chat/completions; this user streams completions
        prompts.extend(data[kind])
    if not prompts:
        raise ValueError(f"no completion prompts for kinds {kinds}")
    return prompts


PROMPTS = load_prompts(os.environ.get("SPECDEC_PROMPT_KINDS", "code_edit,open").split(","))
MAX_TOKENS = int(os.environ.get("SPECDEC_MAX_TOKENS", "64"))
TEMPERATURE = float(os.environ.get("SPECDEC_TEMPERATURE", "0"))
SPECULATIVE = os.environ.get("SPECDEC_SPECULATIVE", "1") not in ("0", "false", "no")
API_KEY = os.environ.get("SPECDEC_API_KEY", "")


def fire(environment, name: str, response_time_ms: float, length: int = 0, exception: Exception | None = None) -> None:
    environment.events.request.fire(
        request_type="SSE",
        name=name,
        response_time=response_time_ms,
        response_length=length,
        exception=exception,
        context={},
    )


class StreamingCompletionUser(HttpUser):
    """Streams greedy completions of the shipped prompts; one request in flight per user."""

    wait_time = between(0.1, 0.5)

    def on_start(self) -> None:
        self.headers = {"Authorization": f"Bearer {API_KEY}"} if API_KEY else {}
        self.model = os.environ.get("SPECDEC_MODEL")
        if not self.model:
            with self.client.get("/v1/models", headers=self.headers, name="/v1/models", catch_response=True) as r:
                if r.status_code != 200:
                    r.failure(f"/v1/models returned {r.status_code}")
                    self.model = "default"
                else:
                    self.model = r.json()["data"][0]["id"]

    @task
    def stream_completion(self) -> None:
        body = {
            "model": self.model,
            "prompt": random.choice(PROMPTS),
            "max_tokens": MAX_TOKENS,
            "temperature": TEMPERATURE,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if not SPECULATIVE:
            body["speculative"] = False

        start = time.perf_counter()
        first = last = None
        completion_tokens = 0
        done = False
        error: str | None = None
        with self.client.post(
            "/v1/completions", json=body, headers=self.headers, stream=True, catch_response=True,
            name="/v1/completions (stream)",
        ) as resp:
            if resp.status_code != 200:
                resp.failure(f"HTTP {resp.status_code}: {resp.text[:200]}")
                return
            # httpx-sse parses the stream, as in the bench and the tests; locust's client is
            # requests-based, so its bytes are handed over as they arrive.
            events = EventSource(httpx.Response(200, headers={"content-type": "text/event-stream"},
                                                content=resp.iter_content(chunk_size=None)))
            for event in events.iter_sse():
                if event.data == "[DONE]":
                    done = True
                    break
                chunk = json.loads(event.data)
                if "error" in chunk:
                    error = str(chunk["error"])
                    continue
                now = time.perf_counter()
                if any(c.get("text") for c in chunk.get("choices") or []):
                    # Recorded now, as the chunk arrives: a stream still running when the test
                    # ends has already counted its first token and its gaps.
                    if first is None:
                        first = now
                        fire(self.environment, "time_to_first_token", (now - start) * 1000)
                    else:
                        fire(self.environment, "inter_token_latency", (now - last) * 1000)
                    last = now
                if chunk.get("usage"):
                    completion_tokens = chunk["usage"].get("completion_tokens", completion_tokens)
            total = time.perf_counter() - start
            if error or not done:
                resp.failure(error or "stream ended without data: [DONE]")
                fire(self.environment, "stream_total", total * 1000, completion_tokens,
                     RuntimeError(error or "incomplete stream"))
                return
            resp.success()

        if first is not None and completion_tokens > 1:
            fire(self.environment, "time_per_output_token", (last - first) * 1000 / (completion_tokens - 1))
        fire(self.environment, "stream_total", total * 1000, completion_tokens)
