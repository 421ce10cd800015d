#!/usr/bin/env python3
"""Record what a coding agent sends: a proxy in front of a server that writes every request (path,
query, body and the headers that shape it; never the key) and the answer's status to a JSONL file,
and streams the answer through unchanged.

    python clients/tools/record_agent.py --upstream http://127.0.0.1:8000 --port 8001 --out session.jsonl
    ANTHROPIC_BASE_URL=http://127.0.0.1:8001 claude -p "..."      # or Codex with base_url .../8001/v1

The recordings are what ``tests/server/test_agent_requests.py`` replays (its fixtures were made so)
and what ``clients/tools/agent_speed.py --session`` times turn by turn.
"""

from __future__ import annotations

import argparse
import gzip
import json
import time
from pathlib import Path
from typing import IO, Any

# Headers that change how a request is served, or tell which client sent it; nothing secret.
KEPT_HEADERS = ("content-type", "accept", "anthropic-version", "anthropic-beta", "user-agent", "originator")
HOP_HEADERS = ("host", "content-length", "connection", "transfer-encoding")


def open_out(path: Path) -> IO[str]:
    return gzip.open(path, "at", encoding="utf-8") if path.suffix == ".gz" else path.open("a", encoding="utf-8")


def build_app(upstream: str, out: IO[str]) -> Any:
    import httpx
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    client = httpx.AsyncClient(base_url=upstream, timeout=None)

    async def forward(request: Request) -> StreamingResponse:
        body = await request.body()
        started = time.time()
        record: dict[str, Any] = {
            "method": request.method, "path": request.url.path, "query": request.url.query,
            "headers": {k: v for k, v in request.headers.items() if k.lower() in KEPT_HEADERS},
            "body": json.loads(body) if body else None, "time": started,
        }
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        upstream_response = await client.send(client.build_request(request.method, target, headers=headers, content=body),
                                              stream=True)
        record["status"] = upstream_response.status_code

        async def relay():
            try:
                async for chunk in upstream_response.aiter_raw():
                    yield chunk
            finally:
                record["seconds"] = round(time.time() - started, 3)
                out.write(json.dumps(record, ensure_ascii=False) + "\n")
                out.flush()
                await upstream_response.aclose()

        passed = {k: v for k, v in upstream_response.headers.items() if k.lower() not in HOP_HEADERS + ("content-encoding",)}
        return StreamingResponse(relay(), status_code=upstream_response.status_code, headers=passed)

    methods = ["GET", "POST", "DELETE", "PUT", "HEAD", "OPTIONS"]
    return Starlette(routes=[Route("/{path:path}", forward, methods=methods)])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--upstream", default="http://127.0.0.1:8000", help="the server the agent's requests go to")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8001)
    p.add_argument("--out", type=Path, required=True, help="the JSONL file appended to (.gz: gzip)")
    args = p.parse_args(argv)
    import uvicorn

    with open_out(args.out) as out:
        uvicorn.run(build_app(args.upstream, out), host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
