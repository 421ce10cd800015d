"""A bounded soak: mixed traffic against one server for a fixed time; errors by kind, server memory
over time, latency percentiles, and whether the server is idle and clean afterwards.

    python clients/tools/soak.py --spawn --model M.gguf --max-model-len 1024          # 240 s, one spawned server
    python clients/tools/soak.py --url http://127.0.0.1:8000 --duration 600 --concurrency 16

Each of ``--concurrency`` workers sends one request after another, each drawn (seeded) from:
streamed and non-streamed completions and chat completions, streams dropped after a few events,
non-streamed requests dropped before their answer, bodies dropped halfway, and bad inputs (invalid
JSON, wrong types, unhashable values, integers beyond int64, wrong Content-Type, unknown routes,
wrong methods, oversized bodies). A result is "ok" when it is what the server
promises: generation answers 200 and streams end in ``data: [DONE]``; every refusal is a 4xx OpenAI
error object with ``x-request-id``. Anything else is an error, counted by kind (``http_500``,
``not_error_object``, ``no_done``, ``transport_ReadTimeout``, ...).

Server memory is sampled every ``--sample-every`` seconds: from ``/proc/<pid>`` for a spawned server
(or ``--pid``), else from ``process_resident_memory_bytes`` in ``/metrics``. After the traffic the
engine must drain to no running or waiting request and an empty KV cache, ``/health`` must answer
200, and (for a spawned server) its log must hold no error-level line. The exit status is 1 if any
of that fails or any request had an error, so the soak can gate a release; it is not part of
``.ci/run`` (it runs for minutes by design).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

import httpx

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # run as `python clients/tools/soak.py`: the checkout's packages import
    sys.path.insert(0, str(REPO))
from clients.benchmark.servers import SpawnedServer  # noqa: E402
from clients.tools.soak_report import build_report, print_report  # noqa: E402

PROMPTS = ["def fibonacci(n):", "The capital of France is", "Once upon a time", "import numpy as np\n"]
CHATS = ["What is a monad?", "Write a haiku about autumn.", "Add type hints: def area(w, h): return w * h"]
# (name, method, path, raw body, extra headers); each must get a 4xx OpenAI error object.
BAD_INPUTS: list[tuple[str, str, str, bytes, dict[str, str]]] = [
    ("invalid_json", "POST", "/v1/completions", b'{"prompt": ', {}),
    ("not_an_object", "POST", "/v1/completions", b"[1, 2]", {}),
    ("wrong_type", "POST", "/v1/completions", b'{"prompt": "hi", "max_tokens": "5"}', {}),
    ("unhashable_role", "POST", "/v1/chat/completions", b'{"messages": [{"role": {}, "content": "hi"}]}', {}),
    ("int_beyond_int64", "POST", "/v1/completions", b'{"prompt": "hi", "seed": 18446744073709551616}', {}),
    ("out_of_range", "POST", "/v1/completions", b'{"prompt": "hi", "temperature": 9}', {}),
    ("unknown_model", "POST", "/v1/completions", b'{"prompt": "hi", "model": "gpt-4"}', {}),
    ("context_overflow", "POST", "/v1/completions", b'{"prompt": "hi", "max_tokens": 100000000}', {}),
    ("text_plain", "POST", "/v1/completions", b'{"prompt": "hi"}', {"content-type": "text/plain"}),
    ("unknown_route", "GET", "/v1/nothing", b"", {}),
    ("wrong_method", "GET", "/v1/completions", b"", {}),
    ("oversized", "POST", "/v1/completions", b'{"prompt": "' + b"x" * (33 * 2**20) + b'"}', {}),
]
KINDS = {  # kind: weight
    "stream": 3, "complete": 2, "chat_stream": 2, "chat": 1,
    "drop_stream": 2, "drop_response": 1, "drop_body": 1, "bad": 3,
}


@dataclass
class Tally:
    """Outcomes and latencies, by request kind."""

    outcomes: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))
    latency: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    ttft: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))

    def add(self, kind: str, outcome: str, seconds: float | None = None, ttft: float | None = None) -> None:
        self.outcomes[kind][outcome] += 1
        if outcome == "ok" and seconds is not None:
            self.latency[kind].append(seconds)
        if outcome == "ok" and ttft is not None:
            self.ttft[kind].append(ttft)

    def errors(self) -> Counter:
        out: Counter = Counter()
        for counts in self.outcomes.values():
            out.update({k: v for k, v in counts.items() if k != "ok"})
        return out


def error_object_problem(r: httpx.Response) -> str | None:
    """None when ``r`` is a 4xx OpenAI error object with a request id; else what is wrong."""
    if r.status_code >= 500 or r.status_code < 400:
        return f"http_{r.status_code}"
    if "x-request-id" not in r.headers:
        return "no_request_id"
    try:
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["message"]
    except Exception:  # noqa: BLE001  (any parse or shape failure is the finding itself)
        return "not_error_object"
    return None


class Soak:
    def __init__(self, url: str, model: str, args: argparse.Namespace) -> None:
        self.url, self.model, self.args = url, model, args
        self.tally = Tally()
        self.headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
        split = urlsplit(url)
        self.host, self.port = split.hostname or "127.0.0.1", split.port or 80

    async def run(self, deadline: float) -> None:
        limits = httpx.Limits(max_connections=self.args.concurrency * 2)
        timeout = httpx.Timeout(self.args.request_timeout)
        async with httpx.AsyncClient(base_url=self.url, headers=self.headers, limits=limits, timeout=timeout) as client:
            workers = [asyncio.create_task(self.worker(client, i, deadline)) for i in range(self.args.concurrency)]
            await asyncio.sleep(max(0.0, deadline - time.monotonic()))
            # Bounded: requests still in flight at the deadline are abandoned (the server sees
            # disconnects, which the idle check afterwards covers) and not counted.
            for task in workers:
                task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)

    async def worker(self, client: httpx.AsyncClient, index: int, deadline: float) -> None:
        rng = random.Random(self.args.seed * 1000 + index)
        kinds, weights = zip(*KINDS.items())
        while time.monotonic() < deadline:
            kind = rng.choices(kinds, weights)[0]
            start = time.perf_counter()
            try:
                outcome, ttft = await getattr(self, kind)(client, rng)
            except httpx.HTTPError as exc:
                outcome, ttft = f"transport_{type(exc).__name__}", None
            self.tally.add(kind, outcome, time.perf_counter() - start, ttft)

    def gen_body(self, rng: random.Random, chat: bool, stream: bool) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "max_tokens": rng.choice((8, 16, 32, 64)),
                                "temperature": rng.choice((0.0, 0.7)), "seed": rng.randrange(1000)}
        if chat:
            body["messages"] = [{"role": "user", "content": rng.choice(CHATS)}]
        else:
            body["prompt"] = rng.choice(PROMPTS)
        if stream:
            body.update(stream=True, stream_options={"include_usage": True})
        return body

    async def _stream(self, client: httpx.AsyncClient, rng: random.Random, chat: bool, drop_after: int | None):
        path = "/v1/chat/completions" if chat else "/v1/completions"
        start = time.perf_counter()
        ttft = None
        async with client.stream("POST", path, json=self.gen_body(rng, chat, True)) as r:
            if r.status_code != 200:
                return f"http_{r.status_code}", None
            events = 0
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    return ("ok" if drop_after is None else "ended_before_drop"), ttft
                if '"error"' in data and json.loads(data).get("error"):
                    return "error_event", None
                events += 1
                if ttft is None:
                    ttft = time.perf_counter() - start
                if drop_after is not None and events >= drop_after:
                    return "ok", ttft  # leaving the block closes the connection mid-stream
        return "no_done", None

    async def stream(self, client: httpx.AsyncClient, rng: random.Random):
        return await self._stream(client, rng, chat=False, drop_after=None)

    async def chat_stream(self, client: httpx.AsyncClient, rng: random.Random):
        return await self._stream(client, rng, chat=True, drop_after=None)

    async def drop_stream(self, client: httpx.AsyncClient, rng: random.Random):
        outcome, ttft = await self._stream(client, rng, chat=rng.random() < 0.5, drop_after=rng.choice((1, 2, 4)))
        return ("ok" if outcome == "ended_before_drop" else outcome), ttft

    async def _complete(self, client: httpx.AsyncClient, rng: random.Random, chat: bool):
        path = "/v1/chat/completions" if chat else "/v1/completions"
        r = await client.post(path, json=self.gen_body(rng, chat, False))
        if r.status_code != 200:
            return f"http_{r.status_code}", None
        choice = r.json()["choices"][0]
        return ("ok" if choice.get("finish_reason") in ("stop", "length") else "bad_finish_reason"), None

    async def complete(self, client: httpx.AsyncClient, rng: random.Random):
        return await self._complete(client, rng, chat=False)

    async def chat(self, client: httpx.AsyncClient, rng: random.Random):
        return await self._complete(client, rng, chat=True)

    async def drop_response(self, client: httpx.AsyncClient, rng: random.Random):
        """A non-streamed request whose client gives up before the answer."""
        body = {**self.gen_body(rng, False, False), "max_tokens": 256, "ignore_eos": True}
        try:
            r = await client.post("/v1/completions", json=body, timeout=rng.choice((0.05, 0.2, 0.5)))
        except httpx.TimeoutException:
            return "ok", None
        return ("ok" if r.status_code == 200 else f"http_{r.status_code}"), None

    async def drop_body(self, client: httpx.AsyncClient, rng: random.Random):
        """Headers and half a body, then the connection closes."""
        body = json.dumps(self.gen_body(rng, False, False)).encode()
        head = (f"POST /v1/completions HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
                + "".join(f"{k}: {v}\r\n" for k, v in self.headers.items())
                + f"Content-Length: {len(body)}\r\n\r\n").encode()
        _, writer = await asyncio.open_connection(self.host, self.port)
        writer.write(head + body[: len(body) // 2])
        await writer.drain()
        writer.close()
        await writer.wait_closed()
        return "ok", None

    async def bad(self, client: httpx.AsyncClient, rng: random.Random):
        name, method, path, raw, extra = rng.choice(BAD_INPUTS)
        headers = {"content-type": "application/json", **extra}
        try:
            r = await client.request(method, path, content=raw or None, headers=headers)
        except httpx.HTTPError as exc:
            return f"{name}:transport_{type(exc).__name__}", None
        problem = error_object_problem(r)
        return (f"{name}:{problem}" if problem else "ok"), None


# -- memory and the server's state --------------------------------------------------------------------


def rss_from_proc(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024 / 2**20
    except OSError:
        return None
    return None


def scrape(url: str, headers: dict[str, str]) -> dict[str, float]:
    text = httpx.get(url + "/metrics", headers=headers, timeout=10).text
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
            out.setdefault(name.split("{", 1)[0], float(value))  # also by bare name (model_name label)
    return out


async def sample_memory(url: str, pid: int | None, every: float, deadline: float, samples: list) -> None:
    start = time.monotonic()
    while True:
        if pid is not None:
            rss = rss_from_proc(pid)
        else:
            rss = (await asyncio.to_thread(scrape, url, {})).get("process_resident_memory_bytes", 0) / 2**20 or None
        samples.append((round(time.monotonic() - start, 1), rss))
        if time.monotonic() >= deadline:
            return
        await asyncio.sleep(min(every, max(0.0, deadline - time.monotonic())))


def wait_idle(url: str, headers: dict[str, str], timeout: float) -> dict[str, float]:
    """The engine's gauges once nothing runs or waits (or as they are at the timeout)."""
    end = time.monotonic() + timeout
    while True:
        m = scrape(url, headers)
        gauges = {k: m.get(f"specdec_{k}", -1.0) for k in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc")}
        if all(v == 0.0 for v in gauges.values()) or time.monotonic() > end:
            gauges["process_open_fds"] = m.get("process_open_fds", -1.0)
            return gauges
        time.sleep(0.5)


# -- the report ------------------------------------------------------------------------------------------


def count_log_errors(path: Path) -> int:
    count = 0
    for line in path.read_text(errors="replace").splitlines():
        try:
            if json.loads(line).get("level") in ("error", "critical"):
                count += 1
        except (json.JSONDecodeError, AttributeError):
            continue
    return count


# -- main ---------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="a running server, e.g. http://127.0.0.1:8000")
    where.add_argument("--spawn", action="store_true", help="start one server (python -m server serve) and stop it after")
    p.add_argument("--duration", type=float, default=240.0, help="seconds of traffic (default 240)")
    p.add_argument("--concurrency", type=int, default=8, help="workers sending requests at once (default 8)")
    p.add_argument("--seed", type=int, default=0, help="seed of the request mix (default 0)")
    p.add_argument("--request-timeout", type=float, default=300.0, help="per-request client timeout, seconds")
    p.add_argument("--sample-every", type=float, default=5.0, help="seconds between memory samples (default 5)")
    p.add_argument("--pid", type=int, help="with --url: read the server's memory from /proc/PID instead of /metrics")
    p.add_argument("--api-key", help="sent as a Bearer token (and given to a spawned server through SPECDEC_API_KEY)")
    p.add_argument("--out", type=Path, help="also write the report as JSON here")
    spawn = p.add_argument_group("spawned server (with --spawn)")
    spawn.add_argument("--model", help="target model (default: the embedded default pair)")
    spawn.add_argument("--draft-model")
    spawn.add_argument("--mode", choices=("off", "draft", "ngram"), default="ngram", help="speculation (default ngram)")
    spawn.add_argument("--max-model-len", type=int, default=1024)
    spawn.add_argument("--max-num-seqs", type=int, default=8)
    spawn.add_argument("--device", default="auto")
    spawn.add_argument("--dtype", default="auto")
    spawn.add_argument("--quantize", default="auto")
    spawn.add_argument("--server-arg", action="append", default=[], help="one more argument for the server (repeatable)")
    spawn.add_argument("--ready-timeout", type=float, default=900.0, help="seconds to wait for the server to load")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    server: SpawnedServer | None = None
    log_dir = Path(tempfile.mkdtemp(prefix="specdec-soak-"))
    try:
        if args.spawn:
            server = SpawnedServer(args.mode, SimpleNamespace(
                device=args.device, dtype=args.dtype, quantize=args.quantize, max_num_seqs=args.max_num_seqs,
                concurrency=[args.concurrency], model=args.model, draft_model=args.draft_model,
                max_model_len=args.max_model_len, num_speculative_tokens=None, server_arg=args.server_arg,
                api_key=args.api_key,
            ), log_dir)
            server.start()
            server.wait_ready(args.ready_timeout)
            url, pid = server.url, server.proc.pid
        else:
            url, pid = args.url.rstrip("/"), args.pid
        headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
        model = httpx.get(url + "/v1/models", headers=headers, timeout=30).json()["data"][0]["id"]
        soak = Soak(url, model, args)
        samples: list[tuple[float, float | None]] = []

        async def both() -> float:
            start = time.monotonic()
            deadline = start + args.duration
            await asyncio.gather(soak.run(deadline), sample_memory(url, pid, args.sample_every, deadline, samples))
            return time.monotonic() - start

        elapsed = asyncio.run(both())
        after = wait_idle(url, headers, timeout=120.0)
        health = httpx.get(url + "/health", timeout=30).status_code
        log_errors = count_log_errors(server.log_path) if server is not None else None
        source = f"/proc/{pid}" if pid is not None else "/metrics"
        report = build_report(soak, args, elapsed, samples, after, health, log_errors, source, list(KINDS))
    finally:
        if server is not None:
            server.stop()
    print_report(report)
    if server is not None:
        print(f"server log: {server.log_path}")
    if args.out:
        args.out.write_text(json.dumps(report, indent=2, default=str))
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
