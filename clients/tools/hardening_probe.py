"""Probe a running specdec server with issue 20's remaining attack classes; print one table row each.

    python clients/tools/hardening_probe.py --url http://127.0.0.1:8000 [--model tiny] [--classes grammar,bodies,...]

For every class: how many requests were tried, how many got a 4xx, a 5xx, a 2xx, or no answer at
all (connection error or timeout), and the worst ``/health`` latency seen by a thread that polls it
(a fresh connection every 10 ms) while the class runs. Meant for a before/after comparison of two
servers started the same way; it sends hostile but bounded traffic, to a server you own only.

Classes (the ``ring`` class is last by default: it killed servers whose compile thread had an
8 MB stack, and a dead server fails every later class):
  tools      the issue's 128 tools x 200 properties, 129 tools, 5,001 properties in one tool
  unsat      schemas no finite JSON matches, on both endpoints (a 2xx here is the old bug)
  bodies     8 MB bodies of the worst shapes for the parser ([[],...], {"k":0,...}, 4M integers)
  grammar    ten waves of five concurrent requests, each with its own 107 KB schema
  ring       a 111 KB schema of 1,100 $defs that refer to each other in a ring
"""

from __future__ import annotations

import argparse
import json
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

import httpx

BODY_MAX = 8 * 1024 * 1024


class HealthPoller:
    """Polls /health on a thread over raw sockets; ``worst_ms`` is the slowest answer (or failure)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port, self.worst_ms = host, port, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.perf_counter()
            try:
                with socket.create_connection((self.host, self.port), timeout=60) as sock:
                    sock.sendall(f"GET /health HTTP/1.1\r\nHost: {self.host}\r\nConnection: close\r\n\r\n".encode())
                    while sock.recv(65536):
                        pass
            except OSError:
                pass
            self.worst_ms = max(self.worst_ms, (time.perf_counter() - t0) * 1000)
            time.sleep(0.01)

    def __enter__(self) -> HealthPoller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(120)


def schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}


def filled(prefix: str, unit: str, suffix: str) -> bytes:
    count = (BODY_MAX - len(prefix) - len(suffix) - 16) // len(unit)
    return (prefix + (unit * count)[:-1] + suffix).encode()


def attacks(model: str) -> dict[str, Callable[[], Iterator[list[tuple[str, bytes]]]]]:
    """Class name -> waves of (path, body); the requests of one wave are sent concurrently."""
    base = {"model": model, "max_tokens": 2}
    user = [{"role": "user", "content": "Hi"}]

    def js(path: str, body: dict) -> tuple[str, bytes]:
        return path, json.dumps(body).encode()

    def tool(name: str, params: dict | None = None) -> dict:
        return {"type": "function", "function": {"name": name, **({"parameters": params} if params else {})}}

    def tools() -> Iterator[list[tuple[str, bytes]]]:
        props = {"type": "object", "properties": {f"property_{j}": {"type": "string", "description": "x" * 40}
                                                  for j in range(200)}}
        yield [js("/v1/chat/completions", {**base, "messages": user, "tools": [tool(f"f{i}", props) for i in range(128)]})]
        yield [js("/v1/chat/completions", {**base, "messages": user, "tools": [tool(f"f{i}") for i in range(129)]})]
        wide = {"type": "object", "properties": {f"p{i}": {} for i in range(5001)}}
        yield [js("/v1/chat/completions", {**base, "messages": user, "tools": [tool("w", wide)]})]

    def unsat() -> Iterator[list[tuple[str, bytes]]]:
        for schema in ({"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]},
                       {"type": "array", "items": {"$ref": "#"}, "minItems": 1}):
            yield [js("/v1/completions", {**base, "prompt": "JSON:", "response_format": schema_format(schema)})]
            yield [js("/v1/chat/completions", {**base, "messages": user, "response_format": schema_format(schema)})]

    def bodies() -> Iterator[list[tuple[str, bytes]]]:
        prefix = f'{{"model":"{model}","prompt":"x","max_tokens":1,"junk":'
        shapes = [filled(prefix + "[", "[],", "]}"), filled(prefix + "{", '"k":0,', "}}"), filled(prefix + "[", "0,", "]}")]
        for raw in shapes:
            yield [("/v1/completions", raw)] * 2

    def grammar() -> Iterator[list[tuple[str, bytes]]]:
        for wave in range(10):
            wave_bodies = []
            for i in range(5):
                names = [f"w{wave}c{i}_{k}" for k in range(1500)]
                schema = {"type": "object", "required": names,
                          "properties": {n: {"type": "string", "pattern": "^[a-z]{1,8}$"} for n in names}}
                wave_bodies.append(js("/v1/completions", {**base, "max_tokens": 1, "prompt": "JSON:",
                                                          "response_format": schema_format(schema)}))
            yield wave_bodies

    def ring() -> Iterator[list[tuple[str, bytes]]]:
        n = 1100
        schema = {"type": "object", "properties": {"a": {"$ref": "#/$defs/d0"}},
                  "$defs": {f"d{i}": {"type": "object", "properties": {"x": {"$ref": f"#/$defs/d{(i + 1) % n}"},
                                                                         "y": {"type": "integer"}}} for i in range(n)}}
        yield [js("/v1/completions", {**base, "prompt": "JSON:", "response_format": schema_format(schema)})]

    return {"tools": tools, "unsat": unsat, "bodies": bodies, "grammar": grammar, "ring": ring}


def outcome(client: httpx.Client, path: str, body: bytes) -> str:
    try:
        status = client.post(path, content=body, headers={"content-type": "application/json"}).status_code
    except httpx.HTTPError:
        return "net"
    return f"{status // 100}xx"


def run_class(url: str, waves: Iterator[list[tuple[str, bytes]]]) -> tuple[Counter, float]:
    parts = urlsplit(url)
    counts: Counter = Counter()
    lock = threading.Lock()
    with httpx.Client(base_url=url, timeout=300) as client, HealthPoller(parts.hostname or "127.0.0.1", parts.port or 80) as poller:
        for wave in waves:
            def send(path: str, body: bytes) -> None:
                result = outcome(client, path, body)
                with lock:
                    counts[result] += 1
            threads = [threading.Thread(target=send, args=item) for item in wave]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    return counts, poller.worst_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default="tiny", help="the served model name")
    parser.add_argument("--classes", default="tools,unsat,bodies,grammar,ring", help="comma-separated, in order")
    args = parser.parse_args()
    table = attacks(args.model)
    print("| class | tried | 4xx | 5xx | 2xx | no answer | worst /health ms |")
    print("|---|---|---|---|---|---|---|")
    for name in args.classes.split(","):
        counts, worst = run_class(args.url, table[name]())
        tried = sum(counts.values())
        print(f"| {name} | {tried} | {counts['4xx']} | {counts['5xx']} | {counts['2xx']} | {counts['net']} | {worst:.0f} |",
              flush=True)


if __name__ == "__main__":
    main()
