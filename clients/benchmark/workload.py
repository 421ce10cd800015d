"""Load generation: the prompt workloads, the closed-loop httpx streaming client and the
per-request results it records."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
from httpx_sse import aconnect_sse  # SSEError is an httpx.HTTPError

from .agentic import load_sessions, run_session
from .progress import log, progress
from .report import Row, fmt, summarize
from .results import RequestResult

PROMPTS_FILE = Path(__file__).resolve().parent.parent / "prompts.json"
KINDS = ("code_edit", "open", "chat", "agentic")


@dataclass
class Workload:
    kind: str
    index: int
    prompt: Any  # str for completions, a list of messages for chat, a session (dict) for agentic


def load_workloads(kinds: list[str], num_prompts: int | None) -> dict[str, list[Workload]]:
    data = json.loads(PROMPTS_FILE.read_text())
    out: dict[str, list[Workload]] = {}
    for kind in kinds:
        every = load_sessions() if kind == "agentic" else data[kind]
        items = every[:num_prompts] if num_prompts else every
        out[kind] = [Workload(kind, i, item) for i, item in enumerate(items)]
    return out


def request_body(wl: Workload, model: str, args: argparse.Namespace, extra: dict) -> tuple[str, dict]:
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": args.agentic_max_tokens if wl.kind == "agentic" else args.max_tokens,
        "temperature": args.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if args.temperature > 0:
        body["seed"] = args.seed + wl.index
    body.update(extra)
    if isinstance(wl.prompt, list):
        body["messages"] = wl.prompt
        return "/v1/chat/completions", body
    body["prompt"] = wl.prompt
    return "/v1/completions", body


async def stream_one(client: httpx.AsyncClient, wl: Workload, model: str, args, extra: dict) -> RequestResult:
    path, body = request_body(wl, model, args, extra)
    res = RequestResult(wl.kind, wl.index)
    parts: list[str] = []
    done = False
    start = time.perf_counter()
    try:
        async with aconnect_sse(client, "POST", path, json=body) as source:
            resp = source.response
            if resp.status_code != 200:
                res.error = f"HTTP {resp.status_code}: {(await resp.aread()).decode(errors='replace')[:300]}"
                return res
            async for event in source.aiter_sse():
                if event.data == "[DONE]":
                    done = True
                    break
                now = time.perf_counter() - start
                chunk = json.loads(event.data)
                if "error" in chunk:
                    res.error = json.dumps(chunk["error"])[:300]
                    continue
                for choice in chunk.get("choices") or []:
                    text = choice.get("text")
                    if text is None:
                        text = (choice.get("delta") or {}).get("content")
                    if text:
                        if res.ttft is None:
                            res.ttft = now
                        if not res.chunk_times or res.chunk_times[-1] != now:
                            res.chunk_times.append(now)
                        parts.append(text)
                    if choice.get("finish_reason"):
                        res.finish_reason = choice["finish_reason"]
                if chunk.get("usage"):
                    res.prompt_tokens = chunk["usage"].get("prompt_tokens")
                    res.completion_tokens = chunk["usage"].get("completion_tokens")
                    res.cached_tokens = (chunk["usage"].get("prompt_tokens_details") or {}).get("cached_tokens")
                if chunk.get("speculative"):
                    res.speculative = chunk["speculative"]
                elif "draft_n" in (chunk.get("timings") or {}):  # llama.cpp's llama-server as a --peer
                    t = chunk["timings"]
                    res.speculative = {"draft_tokens": t["draft_n"], "accepted_tokens": t.get("draft_n_accepted", 0)}
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        res.error = f"{type(exc).__name__}: {exc}"
    res.latency = time.perf_counter() - start
    res.text = "".join(parts)
    if res.error is None and not done:
        res.error = "stream ended without data: [DONE]"
    res.ok = res.error is None
    if res.completion_tokens is None and res.ok:
        res.completion_tokens = len(res.chunk_times)  # no usage chunk: a lower bound
    return res


async def run_workload(client: httpx.AsyncClient, wl: Workload, model: str, args, extra: dict) -> list[RequestResult]:
    """One prompt's request, or an agentic session's turns (one result per turn)."""
    if wl.kind != "agentic":
        return [await stream_one(client, wl, model, args, extra)]

    async def send(messages: list[dict[str, str]]) -> RequestResult:
        return await stream_one(client, Workload(wl.kind, wl.index, messages), model, args, extra)

    return await run_session(wl.prompt, send)


async def run_clients(client: httpx.AsyncClient, workloads: list[Workload], concurrency: int, model: str, args,
                      extra: dict, finished: Callable[[], None] | None = None) -> list[list[RequestResult]]:
    """``concurrency`` clients over ``workloads``, each sending the next one as soon as its last
    one finished (a closed loop); each workload's results, in the workloads' order (a greedy
    output is compared with the same prompt's in another arm)."""
    results: list[list[RequestResult]] = [[] for _ in workloads]
    todo = list(range(len(workloads)))

    async def one_client() -> None:
        while todo:
            i = todo.pop(0)
            results[i] = await run_workload(client, workloads[i], model, args, extra)
            if finished is not None:
                finished()

    await asyncio.gather(*(one_client() for _ in range(min(concurrency, len(workloads)))))
    return results


async def run_level(
    client: httpx.AsyncClient, model: str, workloads: list[Workload], concurrency: int, n_requests: int,
    args, extra: dict, desc: str,
) -> tuple[list[RequestResult], float]:
    bar = progress(n_requests, desc)
    start = time.perf_counter()
    batches = await run_clients(client, [workloads[i % len(workloads)] for i in range(n_requests)], concurrency,
                                model, args, extra, finished=lambda: bar.update(1))
    duration = time.perf_counter() - start
    bar.close()
    return [r for batch in batches for r in batch], duration


def auth_headers(args) -> dict:
    return {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}


async def server_info(base_url: str, args) -> tuple[str, str | None]:
    """The served model name and the server's speculative method (from a tiny probe request)."""
    async with httpx.AsyncClient(base_url=base_url, headers=auth_headers(args), timeout=600) as c:
        r = await c.get("/v1/models")
        r.raise_for_status()
        model = r.json()["data"][0]["id"]
        r = await c.post("/v1/completions", json={"model": model, "prompt": "Hello", "max_tokens": 4, "temperature": 0})
        r.raise_for_status()
        method = (r.json().get("speculative") or {}).get("method")
    return model, method


async def warm_up(client: httpx.AsyncClient, model: str, args, kinds: list[str]) -> None:
    """Untimed requests so that first-call costs (allocations, kernels) stay out of the numbers."""
    for kind in kinds:
        wl = Workload(kind, 0, [{"role": "user", "content": "Hi"}] if kind in ("chat", "agentic") else "Hello, my name is")
        saved = args.max_tokens
        args.max_tokens = 8
        try:
            res = await stream_one(client, wl, model, args, {})
        finally:
            args.max_tokens = saved
        if not res.ok:
            raise RuntimeError(f"warm-up request failed: {res.error}")


async def bench_server(
    base_url: str, mode: str, extra: dict, model: str, workloads: dict[str, list[Workload]], args,
) -> tuple[list[Row], list[dict]]:
    rows: list[Row] = []
    details: list[dict] = []
    conns = max(args.concurrency) + 4
    limits = httpx.Limits(max_connections=conns, max_keepalive_connections=conns)
    timeout = httpx.Timeout(args.request_timeout, connect=30.0)
    async with httpx.AsyncClient(base_url=base_url, headers=auth_headers(args), timeout=timeout, limits=limits) as client:
        await warm_up(client, model, args, list(workloads))
        for kind, wls in workloads.items():
            for c in args.concurrency:
                n = args.requests_per_level or max(len(wls), c)
                results, duration = await run_level(
                    client, model, wls, c, n, args, extra, desc=f"{mode:>5} {kind:<9} c={c:<3}"
                )
                row = summarize(mode, kind, c, results, duration)
                rows.append(row)
                log(f"{mode} {kind} c={c}: {row.output_tok_s:.2f} tok/s, TTFT p50 {fmt(row.ttft_p50_ms)} ms, "
                    f"TPOT p50 {fmt(row.tpot_p50_ms)} ms, acceptance {fmt(row.acceptance_rate, '.2f')}")
                for r in results:
                    d = asdict(r)
                    d.update(mode=mode, concurrency=c)
                    details.append(d)
                if row.failed:
                    log(f"{mode} {kind} c={c}: {row.failed}/{row.requests} requests failed: {row.errors}")
    return rows, details
