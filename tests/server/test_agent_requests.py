"""Coding agents' recorded requests, sent again to the real server: every request Claude Code
2.1.328 and Codex CLI 0.169.0 made in a session on the default pair (``agent_requests/``, recorded
with ``clients/tools/record_agent.py``: long system prompts and tool lists, system and developer
messages between turns, tool calls and their results re-sent in the history, namespace, custom and
hosted tools, ``?beta=true`` and the ``anthropic-*`` headers) must be answered 2xx, with streams in
the shape each client reads (``tests/clients/test_agent_clients.py`` runs the clients themselves).

The model is swapped for the agents' tiny server's and ``max_tokens`` cut, so a request costs
its prefill; the prefix cache is checked on Claude Code's billing header, whose ``cch`` changes
with every request."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import httpx
import pytest

from tests.helpers.servers import AGENT_MODEL, ServerProcess, parse_named_sse

RECORDED = Path(__file__).parent / "agent_requests"
SESSIONS = {"claude_code": RECORDED / "claude_code-2.1.328.jsonl.gz", "codex": RECORDED / "codex-0.169.0.jsonl.gz"}
SERVED_PATHS = ("/v1/messages", "/v1/messages/count_tokens", "/v1/responses")
MAX_TOKENS = 16


def recorded(client: str) -> list[dict]:
    with gzip.open(SESSIONS[client], "rt", encoding="utf-8") as f:
        lines = [json.loads(line) for line in f]
    return [r for r in lines if r["method"] == "POST" and r["path"] in SERVED_PATHS]


def replay(server: ServerProcess, record: dict, **changes: object) -> httpx.Response:
    body = {**record["body"], "model": AGENT_MODEL, **changes}
    for budget in ("max_tokens", "max_output_tokens"):
        if budget in body:
            body[budget] = min(body[budget], MAX_TOKENS)
    if record["path"] == "/v1/responses":
        body["max_output_tokens"] = MAX_TOKENS
    url = f"{server.url}{record['path']}" + (f"?{record['query']}" if record["query"] else "")
    headers = {**record["headers"], "authorization": "Bearer unused"}
    return httpx.post(url, json=body, headers=headers, timeout=600)


@pytest.mark.parametrize("client", sorted(SESSIONS))
def test_every_recorded_request_is_answered_in_the_clients_shape(agent_server: ServerProcess, client: str) -> None:
    records = recorded(client)
    assert records and any(r["body"].get("stream") for r in records)
    for i, record in enumerate(records):
        r = replay(agent_server, record)
        assert r.status_code == 200, (i, record["path"], r.text[:500])
        if record["path"] == "/v1/messages/count_tokens":
            assert r.json()["input_tokens"] > 1000
        elif record["path"] == "/v1/messages":
            events = parse_named_sse(r.text) if record["body"].get("stream") else None
            assert events is None or (events[0]["type"] == "message_start" and events[-1]["type"] == "message_stop")
            prompt = {key: record["body"][key] for key in ("messages", "system", "tools", "tool_choice", "thinking")
                      if key in record["body"]}
            counted = replay(agent_server, {**record, "path": "/v1/messages/count_tokens", "body": prompt})
            assert counted.status_code == 200 and counted.json()["input_tokens"] > 1000, counted.text[:300]
        else:
            events = parse_named_sse(r.text)
            final = events[-1]["response"]
            assert events[-1]["type"] in ("response.completed", "response.incomplete") and final["id"]
            assert {"input_tokens", "output_tokens", "total_tokens"} <= final["usage"].keys()
            done = [e["item"] for e in events if e["type"] == "response.output_item.done"]  # what Codex reads
            assert [item["id"] for item in done] == [item["id"] for item in final["output"]]


def test_recorded_sessions_hold_the_shapes_they_stand_for() -> None:
    """The fixtures are worth replaying only if they hold the cases this file is about."""
    claude, codex = recorded("claude_code"), recorded("codex")
    assert any(r["query"] == "beta=true" and "anthropic-beta" in r["headers"] for r in claude)
    roles = {m["role"] for r in claude if r["path"] == "/v1/messages" for m in r["body"]["messages"]}
    assert roles == {"user", "assistant", "system"}
    blocks = {b["type"] for r in claude if r["path"] == "/v1/messages" for m in r["body"]["messages"]
              if isinstance(m["content"], list) for b in m["content"]}
    assert {"tool_use", "tool_result"} <= blocks
    tool_types = {t["type"] for r in codex for t in r["body"]["tools"]}
    assert {"function", "namespace", "web_search"} <= tool_types
    assert {m.get("role") for m in codex[0]["body"]["input"]} >= {"developer", "user"}


def test_billing_header_does_not_defeat_the_prefix_cache(agent_server: ServerProcess) -> None:
    first = next(r for r in recorded("claude_code") if r["path"] == "/v1/messages")
    usages = []
    for cch in ("00000", "11111"):
        system = [dict(b) for b in first["body"]["system"]]
        system[0]["text"] = re.sub(r"cch=\w+;", f"cch={cch};", system[0]["text"]) if "cch=" in system[0]["text"] \
            else system[0]["text"].rstrip(";") + f"; cch={cch};"
        r = replay(agent_server, first, system=system, stream=False)
        assert r.status_code == 200, r.text[:300]
        usages.append(r.json()["usage"])
    prompt = sum(usages[1][k] for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"))
    # all but the last partial KV block (16 tokens) is read from the cache the first wrote
    assert usages[1]["cache_read_input_tokens"] >= prompt - 16, usages
