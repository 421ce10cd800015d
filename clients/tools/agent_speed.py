#!/usr/bin/env python3
"""How an agent feels on a server: prefill speed at agent-sized prompts, and a recorded agent session
replayed turn by turn (time to first token, output tokens/s, the share of the prompt the prefix
cache served), on specdec and any peer (llama.cpp's ``llama-server`` on the same GGUF) in one run.

    python clients/tools/agent_speed.py --url http://127.0.0.1:8000 --peer llama.cpp=http://127.0.0.1:8081 \\
        --prefill 2048,8192,16384 --session tests/server/agent_requests/claude_code-2.1.328.jsonl.gz

- Prefill: a prompt of about N tokens (this repository's source text behind a random first line, so
  no cache holds any of it) sent to ``/v1/completions`` with ``max_tokens`` 1; tokens/s = the prompt
  tokens the server reports / the request's time (one decoded token included). Each length runs
  ``--repeats`` times; the best is reported (the machine is shared, noise only slows).
- Session replay: every ``/v1/messages`` and ``/v1/responses`` request of a recording
  (``clients/tools/record_agent.py``), in order, streamed, with the served model's name, each turn's
  history as the agent sent it. A turn's TTFT against the first turn's shows what the prefix cache
  saves; on specdec (``/v1/models`` says who serves) the session runs twice, speculation off
  (``"speculative": false``) then on, and each turn's tokens/s on over off is its speculation
  speed-up (``--temperature 0``: the same answer in both arms). ``--max-tokens`` caps each answer.

Prints a table per part and writes them as JSON (``--out``).
"""

from __future__ import annotations

import argparse
import gzip
import json
import secrets
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[2]
SOURCES = sorted((REPO / "server").rglob("*.py")) + sorted((REPO / "specdec_core").rglob("*.py"))
CHARS_PER_TOKEN = 4.3  # this repository's code with Qwen2.5's tokenizer (measured); the server reports the count


def served_model(client: httpx.Client) -> tuple[str, bool]:
    """The served model's name, and whether the server is specdec (its speculation can be turned off)."""
    card = client.get("/v1/models").json()["data"][0]
    return card["id"], card.get("owned_by") == "specdec"


def filler(tokens: int) -> str:
    """About ``tokens`` tokens of source text, behind a first line no cache has seen."""
    want = int(tokens * CHARS_PER_TOKEN)
    text, i = "", 0
    while len(text) < want:
        text += SOURCES[i % len(SOURCES)].read_text()
        i += 1
    return f"# run {secrets.token_hex(8)}\n" + text[:want]


def prefill_rate(client: httpx.Client, model: str, tokens: int, repeats: int) -> dict[str, Any]:
    best: dict[str, Any] | None = None
    for _ in range(repeats):
        started = time.perf_counter()
        r = client.post("/v1/completions", json={"model": model, "prompt": filler(tokens), "max_tokens": 1,
                                                 "temperature": 0.0})
        seconds = time.perf_counter() - started
        r.raise_for_status()
        prompt = r.json()["usage"]["prompt_tokens"]
        row = {"tokens": tokens, "prompt_tokens": prompt, "seconds": round(seconds, 2),
               "tokens_per_s": round(prompt / seconds, 1)}
        best = row if best is None or row["tokens_per_s"] > best["tokens_per_s"] else best
    assert best is not None
    return best


def recorded_turns(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        records = [json.loads(line) for line in f]
    return [r for r in records if r["method"] == "POST" and r["path"] in ("/v1/messages", "/v1/responses")]


# Events that carry generated text: the first one is the first token a client sees.
GENERATED = ("content_block_delta", "response.output_text.delta", "response.function_call_arguments.delta",
             "response.custom_tool_call_input.delta")


def usage_of(event: dict[str, Any]) -> dict[str, Any] | None:
    """The final usage of a stream event, if it carries one (Messages' message_delta, Responses' completed)."""
    if event.get("type") == "message_delta":
        return event.get("usage")
    response = event.get("response")
    if event.get("type") in ("response.completed", "response.incomplete") and isinstance(response, dict):
        return response.get("usage")
    return None


def replay_turn(client: httpx.Client, record: dict[str, Any], model: str, max_tokens: int,
                speculative: bool | None, temperature: float | None) -> dict[str, Any]:
    body = {**record["body"], "model": model, "stream": True}
    if temperature is not None:
        body["temperature"] = temperature
    budget = "max_tokens" if record["path"] == "/v1/messages" else "max_output_tokens"
    body[budget] = min(body.get(budget) or max_tokens, max_tokens)
    if speculative is not None:
        body["speculative"] = speculative
    started = time.perf_counter()
    first = None
    usage: dict[str, Any] = {}
    headers = {k: v for k, v in record["headers"].items() if k.startswith("anthropic-")}
    with client.stream("POST", record["path"], json=body, headers=headers, params=record.get("query") or None) as r:
        if r.status_code != 200:
            return {"error": f"{r.status_code} {r.read().decode(errors='replace')[:200]}"}
        for line in r.iter_lines():
            if not line.startswith("data:"):
                continue
            event = json.loads(line[5:])
            if first is None and event.get("type") in GENERATED:
                first = time.perf_counter()
            usage = usage_of(event) or usage
    total = time.perf_counter() - started
    ttft = (first or time.perf_counter()) - started
    prompt = usage.get("input_tokens", 0) + usage.get("cache_read_input_tokens", 0) + usage.get(
        "cache_creation_input_tokens", 0) if record["path"] == "/v1/messages" else usage.get("input_tokens", 0)
    cached = usage.get("cache_read_input_tokens") if record["path"] == "/v1/messages" else (
        usage.get("input_tokens_details") or {}).get("cached_tokens", 0)
    output = usage.get("output_tokens", 0)
    decode = total - ttft
    return {"prompt_tokens": prompt, "cached_share": round((cached or 0) / prompt, 3) if prompt else None,
            "ttft_s": round(ttft, 2), "output_tokens": output,
            "tokens_per_s": round((output - 1) / decode, 2) if output > 1 and decode > 0 else None,
            "total_s": round(total, 2)}


def replay(client: httpx.Client, turns: list[dict[str, Any]], model: str, max_tokens: int,
           speculative: bool | None, temperature: float | None) -> list[dict[str, Any]]:
    return [{"turn": i, **replay_turn(client, t, model, max_tokens, speculative, temperature)}
            for i, t in enumerate(turns)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the server (specdec, or any other)")
    p.add_argument("--name", default="specdec", help="its name in the results")
    p.add_argument("--peer", action="append", default=[], metavar="NAME=URL", help="another server, e.g. llama-server")
    p.add_argument("--prefill", default="2048,8192,16384", help="prompt lengths in tokens ('' for none)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--session", action="append", default=[], type=Path, help="a recorded session (repeatable)")
    p.add_argument("--max-tokens", type=int, default=256, help="cap of each replayed answer")
    p.add_argument("--temperature", type=float, default=None,
                   help="every turn's temperature (default: what the agent asked, often 1: then the speculation "
                        "arms sample different answers; 0 makes them the same answer)")
    p.add_argument("--timeout", type=float, default=3600.0)
    p.add_argument("--out", type=Path, default=Path("bench-results/agent-speed.json"))
    args = p.parse_args(argv)
    targets = [(args.name, args.url.rstrip("/"))] + [tuple(x.split("=", 1)) for x in args.peer]  # type: ignore[misc]
    lengths = [int(x) for x in args.prefill.split(",") if x.strip()]
    results: dict[str, Any] = {"prefill": [], "sessions": []}
    for name, url in targets:
        with httpx.Client(base_url=url, timeout=args.timeout) as client:
            model, is_specdec = served_model(client)
            for n in lengths:
                row = {"server": name, **prefill_rate(client, model, n, args.repeats)}
                results["prefill"].append(row)
                print(json.dumps(row), flush=True)
            for path in args.session:
                turns = recorded_turns(path)
                arms = [("off", False), ("on", None)] if is_specdec else [("-", None)]
                for arm, speculative in arms:
                    rows = replay(client, turns, model, args.max_tokens, speculative, args.temperature)
                    results["sessions"].append({"server": name, "session": path.name, "speculation": arm, "turns": rows})
                    for row in rows:
                        print(json.dumps({"server": name, "session": path.name, "speculation": arm, **row}), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
