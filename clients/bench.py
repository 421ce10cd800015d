#!/usr/bin/env python3
"""Benchmark specdec: speculation off vs draft model vs n-gram, against same-run transformers baselines.

Two ways to point it at a server:

    # start one server per speculation mode (off = --speculative-method none), measure, stop it
    python clients/bench.py --spawn --model path/to/target --draft-model path/to/draft
    python clients/bench.py --spawn                       # the embedded default pair (Qwen2.5-Coder 1.5B + 0.5B)
    python clients/bench.py --spawn --quick --model SmolLM2-135M-Instruct.Q4_1.gguf --max-model-len 1024

    # a server that is already running: its --speculative-method is fixed, so only "off" (sent as the
    # per-request extension "speculative": false) and the server's own method can be measured
    python clients/bench.py --url http://127.0.0.1:8000

For every (mode, prompt kind, concurrency) it streams the prompt set of clients/prompts.json with
httpx (a closed loop of ``concurrency`` workers) and reports output tokens/s, time to first token
(TTFT) p50/p99, inter-token latency (ITL: the gap between consecutive streamed chunks, as a client
sees it; a chunk carries several tokens when drafts were accepted) p50/p99, time per output token
(TPOT: (last chunk - first chunk) / (tokens - 1)) p50, the acceptance rate and mean accepted length
from the server's ``speculative`` reports, the throughput ratio to speculation off, and how many
greedy outputs are identical to the "off" output for the same prompt.

Same-run baselines at concurrency 1 (after the servers are stopped, on the same prompts and models):
``transformers`` ``generate()`` (``hf``), assisted generation with the draft model
(``hf_assisted``, ``assistant_model=``) and prompt lookup (``hf_prompt_lookup``,
``prompt_lookup_num_tokens=``).

Writes ``<out>/bench-<timestamp>.json`` and ``.png`` (matplotlib) and prints a table.
``--quick``: 2 prompts per kind, 32 tokens, concurrency 1 and 4 (minutes on 2 CPU cores with a small
model).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as _dt
import json
import math
import os
import platform
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from httpx_sse import aconnect_sse  # SSEError is an httpx.HTTPError

PROMPTS_FILE = Path(__file__).with_name("prompts.json")
KINDS = ("code_edit", "open", "chat")
MODES = ("off", "draft", "ngram")
BASELINES = ("hf", "hf_assisted", "hf_prompt_lookup")
MODE_TO_METHOD = {"off": "none", "draft": "draft", "ngram": "ngram"}


# --------------------------------------------------------------------------------------------------
# arguments


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Benchmark specdec speculation modes against transformers baselines.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument("--url", default=None, help="base URL of a running server (default http://127.0.0.1:8000)")
    where.add_argument("--spawn", action="store_true", help="start one server per mode on free loopback ports")

    g = p.add_argument_group("models (--spawn and baselines)")
    g.add_argument("--model", default=None, help="target: HF dir, cached hub id or .gguf (default: embedded pair)")
    g.add_argument("--draft-model", default=None, help="draft model (needed for the draft mode unless default pair)")
    g.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    g.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    g.add_argument("--quantize", default="auto", choices=["auto", "none", "int8"],
                   help="the servers' --quantize (default auto: per-row int8 on CPU); the transformers "
                        "baselines get torch's dynamic int8 for int8, its closest equivalent")
    g.add_argument("--max-model-len", type=int, default=None)
    g.add_argument("--max-num-seqs", type=int, default=None, help="default: the largest concurrency level")
    g.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                   help="extra argument(s) for every spawned server, e.g. --server-arg='--log-level warning'")
    g.add_argument("--startup-timeout", type=float, default=3600.0,
                   help="seconds to wait for /health (the first start converts GGUF weights)")

    w = p.add_argument_group("workload")
    w.add_argument("--modes", default=",".join(MODES), help="comma list of off,draft,ngram")
    w.add_argument("--kinds", default=",".join(KINDS), help="comma list of code_edit,open,chat")
    w.add_argument("--concurrency", default="1,4,16", help="comma list of concurrency levels")
    w.add_argument("--num-prompts", type=int, default=None, help="prompts per kind (default: all 10)")
    w.add_argument("--requests-per-level", type=int, default=None,
                   help="requests per (mode, kind, concurrency) (default: max(num prompts, concurrency))")
    w.add_argument("--max-tokens", type=int, default=128)
    w.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    w.add_argument("--seed", type=int, default=0, help="per-request seed when sampling")
    w.add_argument("--num-speculative-tokens", type=int, default=None, help="k (server default when unset)")
    w.add_argument("--request-timeout", type=float, default=1800.0)
    w.add_argument("--api-key", default=os.environ.get("SPECDEC_API_KEY") or os.environ.get("OPENAI_API_KEY"))

    b = p.add_argument_group("baselines (concurrency 1, in this process, after the servers)")
    b.add_argument("--baselines", default=",".join(BASELINES), help="comma list of hf,hf_assisted,hf_prompt_lookup")
    b.add_argument("--no-baselines", action="store_true")

    o = p.add_argument_group("output")
    o.add_argument("--out", default="bench-results", help="directory for the JSON and PNG")
    o.add_argument("--tag", default="", help="appended to the file names")
    o.add_argument("--no-chart", action="store_true")
    o.add_argument("--quick", action="store_true",
                   help="2 prompts per kind, 32 tokens, concurrency 1,4 (unless set explicitly)")

    args = p.parse_args(argv)
    given = {a.split("=")[0] for a in (argv if argv is not None else sys.argv[1:]) if a.startswith("--")}
    if args.quick:
        if "--num-prompts" not in given:
            args.num_prompts = 2
        if "--max-tokens" not in given:
            args.max_tokens = 32
        if "--concurrency" not in given:
            args.concurrency = "1,4"
    if not args.spawn and args.url is None:
        args.url = "http://127.0.0.1:8000"
    args.modes = _csv(args.modes, MODES, "--modes")
    args.kinds = _csv(args.kinds, KINDS, "--kinds")
    args.baselines = [] if args.no_baselines else _csv(args.baselines, BASELINES, "--baselines")
    try:
        args.concurrency = sorted({int(c) for c in args.concurrency.split(",") if c.strip()})
    except ValueError:
        p.error("--concurrency takes a comma list of integers")
    if not args.concurrency or min(args.concurrency) < 1:
        p.error("--concurrency levels must be >= 1")
    if args.max_tokens < 1:
        p.error("--max-tokens must be >= 1")
    args.server_arg = [x for a in args.server_arg for x in shlex.split(a)]
    # Spawned servers run from the repository root: make local model paths absolute first.
    for name in ("model", "draft_model"):
        value = getattr(args, name)
        if value and os.path.exists(value):
            setattr(args, name, os.path.abspath(value))
    return args


def _csv(value: str, allowed: tuple[str, ...], flag: str) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    bad = [v for v in items if v not in allowed]
    if bad:
        raise SystemExit(f"{flag}: unknown {bad}; choose from {','.join(allowed)}")
    return items


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------------
# prompts


@dataclass
class Workload:
    kind: str
    index: int
    prompt: Any  # str for completions, a list of messages for chat


def load_workloads(kinds: list[str], num_prompts: int | None) -> dict[str, list[Workload]]:
    data = json.loads(PROMPTS_FILE.read_text())
    out: dict[str, list[Workload]] = {}
    for kind in kinds:
        items = data[kind][:num_prompts] if num_prompts else data[kind]
        out[kind] = [Workload(kind, i, item) for i, item in enumerate(items)]
    return out


# --------------------------------------------------------------------------------------------------
# one streamed request


@dataclass
class RequestResult:
    kind: str
    prompt_index: int
    ok: bool = False
    error: str | None = None
    ttft: float | None = None  # seconds
    chunk_times: list[float] = field(default_factory=list)  # arrival of each chunk with text, from start
    latency: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    speculative: dict | None = None
    text: str = ""


def request_body(wl: Workload, model: str, args: argparse.Namespace, extra: dict) -> tuple[str, dict]:
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if args.temperature > 0:
        body["seed"] = args.seed + wl.index
    body.update(extra)
    if wl.kind == "chat":
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
                if chunk.get("speculative"):
                    res.speculative = chunk["speculative"]
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


# --------------------------------------------------------------------------------------------------
# statistics


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    k = (len(s) - 1) * q / 100.0
    lo = math.floor(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def _ms(x: float | None) -> float | None:
    return None if x is None else round(x * 1000.0, 2)


@dataclass
class Row:
    mode: str
    kind: str
    concurrency: int
    requests: int
    failed: int
    duration_s: float
    output_tokens: int
    output_tok_s: float
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    itl_p50_ms: float | None
    itl_p99_ms: float | None
    tpot_p50_ms: float | None
    tokens_per_chunk: float | None
    acceptance_rate: float | None
    mean_accepted_length: float | None
    draft_tokens: int
    accepted_tokens: int
    ratio_to_off: float | None = None
    same_as_off: str | None = None
    errors: list[str] = field(default_factory=list)


def summarize(mode: str, kind: str, concurrency: int, results: list[RequestResult], duration: float) -> Row:
    ok = [r for r in results if r.ok]
    tokens = sum(r.completion_tokens or 0 for r in ok)
    chunks = sum(len(r.chunk_times) for r in ok)
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    itls = [b - a for r in ok for a, b in zip(r.chunk_times, r.chunk_times[1:])]
    tpots = [
        (r.chunk_times[-1] - r.chunk_times[0]) / (r.completion_tokens - 1)
        for r in ok
        if r.completion_tokens and r.completion_tokens > 1 and len(r.chunk_times) > 1
    ]
    draft = accepted = 0
    steps = 0
    weighted_len = 0.0
    spec_seen = False
    for r in ok:
        s = r.speculative
        if not s:
            continue
        spec_seen = True
        draft += int(s.get("draft_tokens") or 0)
        accepted += int(s.get("accepted_tokens") or 0)
        st = int(s.get("steps") or 0)
        steps += st
        weighted_len += float(s.get("mean_accepted_length") or 0.0) * st
    return Row(
        mode=mode,
        kind=kind,
        concurrency=concurrency,
        requests=len(results),
        failed=len(results) - len(ok),
        duration_s=round(duration, 3),
        output_tokens=tokens,
        output_tok_s=round(tokens / duration, 3) if duration > 0 else 0.0,
        ttft_p50_ms=_ms(percentile(ttfts, 50)),
        ttft_p99_ms=_ms(percentile(ttfts, 99)),
        itl_p50_ms=_ms(percentile(itls, 50)),
        itl_p99_ms=_ms(percentile(itls, 99)),
        tpot_p50_ms=_ms(percentile(tpots, 50)),
        tokens_per_chunk=round(tokens / chunks, 3) if chunks else None,
        acceptance_rate=round(accepted / draft, 4) if draft else (0.0 if spec_seen and mode != "off" else None),
        mean_accepted_length=round(weighted_len / steps, 4) if steps else None,
        draft_tokens=draft,
        accepted_tokens=accepted,
        errors=sorted({r.error for r in results if r.error})[:5],
    )


# --------------------------------------------------------------------------------------------------
# load generation against one server


class _LineProgress:
    """Progress as plain log lines (for logs and pipes, where a redrawn bar is noise)."""

    def __init__(self, total: int, desc: str) -> None:
        self.total, self.desc, self.n = total, desc, 0
        self.start = time.perf_counter()
        self.step = max(1, total // 4)

    def update(self, k: int = 1) -> None:
        self.n += k
        if self.n == self.total or self.n % self.step == 0:
            log(f"{self.desc.strip()}: {self.n}/{self.total} requests, {time.perf_counter() - self.start:.1f}s")

    def close(self) -> None:
        pass


def _progress(total: int, desc: str):
    if sys.stderr.isatty():
        try:
            from tqdm import tqdm

            return tqdm(total=total, desc=desc, file=sys.stderr, leave=True, mininterval=0.5, dynamic_ncols=True)
        except ImportError:  # pragma: no cover - tqdm is a dependency of specdec
            pass
    return _LineProgress(total, desc)


async def run_level(
    client: httpx.AsyncClient, model: str, workloads: list[Workload], concurrency: int, n_requests: int,
    args, extra: dict, desc: str,
) -> tuple[list[RequestResult], float]:
    todo = list(range(n_requests))
    results: list[RequestResult] = []
    bar = _progress(n_requests, desc)

    async def worker() -> None:
        while todo:
            i = todo.pop(0)
            results.append(await stream_one(client, workloads[i % len(workloads)], model, args, extra))
            bar.update(1)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(min(concurrency, n_requests))))
    duration = time.perf_counter() - start
    bar.close()
    return results, duration


def _headers(args) -> dict:
    return {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}


async def server_info(base_url: str, args) -> tuple[str, str | None]:
    """The served model name and the server's speculative method (from a tiny probe request)."""
    async with httpx.AsyncClient(base_url=base_url, headers=_headers(args), timeout=600) as c:
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
        wl = Workload(kind, 0, [{"role": "user", "content": "Hi"}] if kind == "chat" else "Hello, my name is")
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
    async with httpx.AsyncClient(base_url=base_url, headers=_headers(args), timeout=timeout, limits=limits) as client:
        await warm_up(client, model, args, list(workloads))
        for kind, wls in workloads.items():
            for c in args.concurrency:
                n = args.requests_per_level or max(len(wls), c)
                results, duration = await run_level(
                    client, model, wls, c, n, args, extra, desc=f"{mode:>5} {kind:<9} c={c:<3}"
                )
                row = summarize(mode, kind, c, results, duration)
                rows.append(row)
                log(f"{mode} {kind} c={c}: {row.output_tok_s:.2f} tok/s, TTFT p50 {_fmt(row.ttft_p50_ms)} ms, "
                    f"TPOT p50 {_fmt(row.tpot_p50_ms)} ms, acceptance {_fmt(row.acceptance_rate, '.2f')}")
                for r in results:
                    d = asdict(r)
                    d.update(mode=mode, concurrency=c)
                    details.append(d)
                if row.failed:
                    log(f"{mode} {kind} c={c}: {row.failed}/{row.requests} requests failed: {row.errors}")
    return rows, details


# --------------------------------------------------------------------------------------------------
# spawned servers


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SpawnedServer:
    """``python -m server serve`` for one mode on a free loopback port, logging to a file."""

    def __init__(self, mode: str, args, log_dir: Path) -> None:
        self.mode = mode
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_dir / f"server-{mode}.log"
        cmd = [sys.executable, "-m", "server", "serve", "--host", "127.0.0.1", "--port", str(self.port),
               "--speculative-method", MODE_TO_METHOD[mode],
               "--device", args.device, "--dtype", args.dtype, "--quantize", args.quantize,
               "--max-num-seqs", str(args.max_num_seqs or max(args.concurrency))]
        if args.model:
            cmd += ["--model", args.model]
        if args.draft_model and mode == "draft":
            cmd += ["--draft-model", args.draft_model]
        if args.max_model_len:
            cmd += ["--max-model-len", str(args.max_model_len)]
        if args.num_speculative_tokens is not None and mode != "off":
            cmd += ["--num-speculative-tokens", str(args.num_speculative_tokens)]
        cmd += args.server_arg
        self.cmd = cmd
        self.api_key = args.api_key
        self.proc: subprocess.Popen | None = None
        self._log = None

    def start(self) -> None:
        log(f"starting {self.mode} server: {shlex.join(self.cmd)} (log: {self.log_path})")
        self._log = open(self.log_path, "wb")
        repo_root = Path(__file__).resolve().parent.parent
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(repo_root), env.get("PYTHONPATH")]))
        if self.api_key:  # through the environment: keeps the key out of the process list
            env["SPECDEC_API_KEY"] = self.api_key
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                     cwd=repo_root, start_new_session=True)

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        next_note = time.monotonic() + 30
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.mode} server exited with code {self.proc.returncode}:\n{self.tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    log(f"{self.mode} server ready at {self.url}")
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.mode} server not healthy after {timeout:.0f}s:\n{self.tail()}")
            if time.monotonic() > next_note:
                log(f"waiting for the {self.mode} server (loading models; last log line: {self.tail(1).strip()!r})")
                next_note = time.monotonic() + 30
            time.sleep(1.0)

    def tail(self, n: int = 20) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                log(f"{self.mode} server ignored SIGTERM for 60s; killing it")
                self.proc.kill()
                self.proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None


# --------------------------------------------------------------------------------------------------
# transformers baselines


def _load_pair(args, need_draft: bool):
    """Target (and draft) through specdec's own loader when present, else plain transformers."""
    import torch

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    repo_root = str(Path(__file__).resolve().parent.parent)
    if repo_root not in sys.path:  # run from a checkout without `pip install -e .`
        sys.path.append(repo_root)
    try:
        from specdec_core.loader import load_model  # type: ignore

        log("baselines load their models through specdec_core.loader.load_model (converted-weights cache)")
    except ImportError as exc:
        load_model = None
        log(f"specdec_core.loader is not importable ({exc}); loading baselines with transformers directly")

    def load(source: str | None, role: str):
        if load_model is not None:
            from specdec_core.config import default_cache_dir  # type: ignore

            from specdec_core.loader import resolve_device, resolve_dtype, resolve_quantize  # type: ignore

            dev = resolve_device(device)
            lm = load_model(source, role=role, device=dev, dtype=args.dtype, cache_dir=default_cache_dir(), progress=True)
            mode = resolve_quantize(args.quantize, dev, resolve_dtype(args.dtype, dev))
            return _dynamic_int8(lm.model) if mode == "int8" else lm.model, lm.tokenizer
        if source is None:
            raise RuntimeError("the embedded default pair needs specdec_core.loader; pass --model/--draft-model")
        return _load_with_transformers(source, device, args.dtype, args.quantize)

    target, tok = load(args.model, "target")
    draft = None
    if need_draft:
        if args.model is None or args.draft_model:
            draft, _ = load(args.draft_model, "draft")
    return target, draft, tok, device


def _load_with_transformers(source: str, device: str, dtype: str, quantize: str):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(
        dtype, torch.bfloat16 if device == "cuda" else torch.float32)
    path = Path(source)
    kw: dict[str, Any] = {}
    if path.suffix == ".gguf":
        kw["gguf_file"] = path.name
        source = str(path.parent)
    tok = AutoTokenizer.from_pretrained(source, **kw)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch_dtype, **kw).to(device).eval()
    if quantize == "int8" or (quantize == "auto" and device == "cpu" and torch_dtype == torch.float32):
        model = _dynamic_int8(model)
    return model, tok


def _dynamic_int8(model):
    """transformers has no per-row int8; torch's dynamic int8 is what a transformers user would run."""
    import torch

    return torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)


def run_baselines(args, workloads: dict[str, list[Workload]]) -> tuple[list[Row], list[dict], list[str]]:
    import torch
    from transformers import GenerationConfig
    from transformers.generation.streamers import BaseStreamer

    notes: list[str] = []
    wanted = list(args.baselines)
    need_draft = "hf_assisted" in wanted
    log(f"loading models for the transformers baselines ({', '.join(wanted)})")
    target, draft, tok, device = _load_pair(args, need_draft)
    if "hf_assisted" in wanted and draft is None:
        wanted.remove("hf_assisted")
        notes.append("hf_assisted skipped: no draft model (pass --draft-model)")
    k = args.num_speculative_tokens or 4

    class Timer(BaseStreamer):
        def __init__(self, start: float) -> None:
            self.start = start
            self.times: list[float] = []
            self.counts: list[int] = []
            self.prompt_seen = False

        def put(self, value) -> None:
            if not self.prompt_seen:  # generate() first hands over the prompt
                self.prompt_seen = True
                return
            self.times.append(time.perf_counter() - self.start)
            self.counts.append(int(value.numel()))

        def end(self) -> None:
            pass

    # Stop on the ids the server stops on (same rule, same function): otherwise the runs differ in length.
    from specdec_core.eos import eos_token_ids  # _load_pair put the repository root on sys.path

    eos = sorted(eos_token_ids(target, tok)) or None
    pad = tok.pad_token_id if tok.pad_token_id is not None else (eos[0] if eos else 0)
    rows: list[Row] = []
    details: list[dict] = []
    def extra_for(name: str) -> dict[str, Any]:
        if name == "hf_assisted":
            return {"assistant_model": draft}
        if name == "hf_prompt_lookup":
            return {"prompt_lookup_num_tokens": k}
        return {}

    for name in wanted:
        # Untimed warm-up, as for the servers: first-call costs stay out of the numbers.
        warm = {kk: v.to(device) for kk, v in tok("Hello, my name is", return_tensors="pt").items()}
        with torch.inference_mode():
            target.generate(**warm, generation_config=GenerationConfig(
                max_new_tokens=4, do_sample=False, eos_token_id=eos, pad_token_id=pad,
                temperature=None, top_p=None, top_k=None), **extra_for(name))
        for kind, wls in workloads.items():
            results: list[RequestResult] = []
            bar = _progress(len(wls), f"{name:>16} {kind:<9} c=1")
            t0 = time.perf_counter()
            for wl in wls:
                if kind == "chat":
                    text = tok.apply_chat_template(wl.prompt, tokenize=False, add_generation_prompt=True)
                    enc = tok(text, return_tensors="pt", add_special_tokens=False)
                else:
                    enc = tok(wl.prompt, return_tensors="pt")
                enc = {kk: v.to(device) for kk, v in enc.items()}
                gen = GenerationConfig(
                    max_new_tokens=args.max_tokens, eos_token_id=eos, pad_token_id=pad,
                    do_sample=args.temperature > 0, temperature=args.temperature if args.temperature > 0 else None,
                    top_p=None, top_k=None,
                )
                extra = extra_for(name)
                if args.temperature > 0:
                    torch.manual_seed(args.seed + wl.index)
                start = time.perf_counter()
                timer = Timer(start)
                res = RequestResult(kind, wl.index)
                try:
                    with torch.inference_mode():
                        out = target.generate(**enc, generation_config=gen, streamer=timer, **extra)
                    new = out[0, enc["input_ids"].shape[1]:].tolist()
                    res.ok = True
                    res.completion_tokens = len(new)
                    res.prompt_tokens = int(enc["input_ids"].shape[1])
                    res.text = tok.decode(new, skip_special_tokens=True)
                    res.chunk_times = timer.times
                    res.ttft = timer.times[0] if timer.times else None
                    if name != "hf":
                        res.speculative = None  # transformers does not report acceptance per request
                except Exception as exc:  # noqa: BLE001 - a baseline failure is reported, not fatal
                    res.error = f"{type(exc).__name__}: {exc}"
                res.latency = time.perf_counter() - start
                results.append(res)
                bar.update(1)
            duration = time.perf_counter() - t0
            bar.close()
            row = summarize(name, kind, 1, results, duration)
            rows.append(row)
            log(f"{name} {kind} c=1: {row.output_tok_s:.2f} tok/s, TTFT p50 {_fmt(row.ttft_p50_ms)} ms, "
                f"TPOT p50 {_fmt(row.tpot_p50_ms)} ms")
            if row.failed:
                notes.append(f"{name} {kind}: {row.failed} failures: {row.errors}")
            for r in results:
                d = asdict(r)
                d.update(mode=name, concurrency=1)
                details.append(d)
    if args.temperature == 0:
        notes.append("baseline ITL/TPOT: hf streams one token per step; hf_assisted/hf_prompt_lookup stream "
                     "each accepted run as one chunk")
    return rows, details, notes


# --------------------------------------------------------------------------------------------------
# report


def add_comparisons(rows: list[Row], details: list[dict], greedy: bool) -> None:
    off = {(r.kind, r.concurrency): r for r in rows if r.mode == "off"}
    for r in rows:
        base = off.get((r.kind, r.concurrency)) or (off.get((r.kind, 1)) if r.mode in BASELINES else None)
        if base is not None and base.output_tok_s > 0:
            r.ratio_to_off = round(r.output_tok_s / base.output_tok_s, 3)
    if not greedy:
        return
    # Reference text per prompt: the "off" run at the lowest concurrency.
    ref: dict[tuple[str, int], str] = {}
    for d in sorted((d for d in details if d["mode"] == "off" and d["ok"]), key=lambda d: d["concurrency"]):
        ref.setdefault((d["kind"], d["prompt_index"]), d["text"])
    if not ref:
        return
    for r in rows:
        same = total = 0
        for d in details:
            if d["mode"] == r.mode and d["kind"] == r.kind and d["concurrency"] == r.concurrency and d["ok"]:
                key = (d["kind"], d["prompt_index"])
                if key in ref:
                    total += 1
                    same += d["text"] == ref[key]
        if total:
            r.same_as_off = f"{same}/{total}"


def _fmt(x, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def print_table(rows: list[Row]) -> None:
    head = (f"{'mode':<16} {'kind':<9} {'conc':>4} {'req':>4} {'tok/s':>8} {'x off':>6} "
            f"{'TTFT p50':>9} {'p99':>8} {'ITL p50':>8} {'p99':>8} {'TPOT p50':>9} "
            f"{'accept':>6} {'acc len':>7} {'same':>7}")
    print()
    print("latencies in ms; ITL = gap between streamed chunks; TPOT = per output token; "
          "same = greedy outputs identical to 'off'")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r.mode:<16} {r.kind:<9} {r.concurrency:>4} {r.requests - r.failed:>4} {r.output_tok_s:>8.2f} "
              f"{_fmt(r.ratio_to_off, '.2f'):>6} {_fmt(r.ttft_p50_ms):>9} {_fmt(r.ttft_p99_ms):>8} "
              f"{_fmt(r.itl_p50_ms):>8} {_fmt(r.itl_p99_ms):>8} {_fmt(r.tpot_p50_ms):>9} "
              f"{_fmt(r.acceptance_rate, '.2f'):>6} {_fmt(r.mean_accepted_length, '.2f'):>7} "
              f"{r.same_as_off or '-':>7}")
    print()


def write_chart(rows: list[Row], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = list(dict.fromkeys(r.kind for r in rows))
    modes = list(dict.fromkeys(r.mode for r in rows if r.mode not in BASELINES))
    bases = list(dict.fromkeys(r.mode for r in rows if r.mode in BASELINES))
    concs = sorted({r.concurrency for r in rows})
    colors = {"off": "#7f7f7f", "draft": "#1f77b4", "ngram": "#2ca02c",
              "hf": "#d62728", "hf_assisted": "#ff7f0e", "hf_prompt_lookup": "#9467bd"}
    fig, axes = plt.subplots(len(kinds), 2, figsize=(13, 3.8 * len(kinds)), squeeze=False)
    for i, kind in enumerate(kinds):
        ax_t, ax_l = axes[i]
        labelled: set[str] = set()
        for ci, c in enumerate(concs):
            # Bars of the series measured at this concurrency, centred on its tick.
            present = [(m, r) for m in modes + bases
                       for r in rows if r.mode == m and r.kind == kind and r.concurrency == c]
            width = 0.8 / max(len(present), 1)
            for j, (m, r) in enumerate(present):
                x = ci + (j - (len(present) - 1) / 2) * width
                style = dict(color=colors.get(m), hatch="//" if m in BASELINES else None,
                             label=None if m in labelled else m)
                labelled.add(m)
                ax_t.bar([x], [r.output_tok_s], width, **style)
                ax_l.bar([x], [r.tpot_p50_ms or 0.0], width, **style)
                if r.ratio_to_off is not None and m != "off":
                    ax_t.annotate(f"{r.ratio_to_off:.2f}x", (x, r.output_tok_s), ha="center", va="bottom", fontsize=7)
        for ax, ylabel in ((ax_t, "output tokens/s"), (ax_l, "TPOT p50 (ms/token)")):
            ax.set_xticks(range(len(concs)))
            ax.set_xticklabels([f"c={c}" for c in concs])
            ax.set_ylabel(ylabel)
            ax.set_title(f"{kind}: {ylabel}")
            ax.grid(axis="y", alpha=0.3)
        ax_t.legend(fontsize=7, framealpha=0.7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def machine_info(args) -> dict:
    info: dict[str, Any] = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
    }
    try:
        import torch
        import transformers

        info["torch"] = torch.__version__
        info["transformers"] = transformers.__version__
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return info


# --------------------------------------------------------------------------------------------------
# main


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    workloads = load_workloads(args.kinds, args.num_prompts)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S") + (f"-{args.tag}" if args.tag else "")
    rows: list[Row] = []
    details: list[dict] = []
    notes: list[str] = []
    servers: dict[str, dict] = {}
    greedy = args.temperature == 0

    n_levels = len(args.kinds) * len(args.concurrency)
    log(f"modes {args.modes}, kinds {args.kinds}, concurrency {args.concurrency}, "
        f"max_tokens {args.max_tokens}, {'greedy' if greedy else f'temperature {args.temperature}'}, "
        f"{n_levels} levels per mode")

    if args.spawn:
        for mode in args.modes:
            if mode == "draft" and args.model and not args.draft_model:
                notes.append("draft mode skipped: --model given without --draft-model")
                log(notes[-1])
                continue
            server = SpawnedServer(mode, args, out_dir)
            try:
                server.start()
                server.wait_ready(args.startup_timeout)
                model, method = asyncio.run(server_info(server.url, args))
                servers[mode] = {"cmd": server.cmd, "model": model, "method": method}
                mode_rows, mode_details = asyncio.run(bench_server(server.url, mode, {}, model, workloads, args))
                rows += mode_rows
                details += mode_details
            except (RuntimeError, httpx.HTTPError) as exc:
                notes.append(f"{mode} server failed: {exc}")
                log(notes[-1])
            finally:
                server.stop()
    else:
        model, method = asyncio.run(server_info(args.url, args))
        log(f"server at {args.url} serves {model!r} with speculative method {method!r}")
        servers["url"] = {"url": args.url, "model": model, "method": method}
        for mode in args.modes:
            if mode == "off":
                extra: dict = {"speculative": False}
            elif method == mode:
                extra = {}
                if args.num_speculative_tokens is not None:
                    extra["num_speculative_tokens"] = args.num_speculative_tokens
            else:
                notes.append(f"{mode} mode skipped: the server at {args.url} runs method {method!r} (its method is "
                             f"fixed at start; restart it with --speculative-method {mode}, or use --spawn)")
                log(notes[-1])
                continue
            mode_rows, mode_details = asyncio.run(bench_server(args.url, mode, extra, model, workloads, args))
            rows += mode_rows
            details += mode_details

    if args.baselines:
        if not args.spawn and args.model is None:
            notes.append("baselines use the embedded default pair (pass --model/--draft-model to match the "
                         "server at --url)")
        try:
            b_rows, b_details, b_notes = run_baselines(args, workloads)
            rows += b_rows
            details += b_details
            notes += b_notes
        except Exception as exc:  # noqa: BLE001 - the server numbers are still worth writing
            notes.append(f"baselines failed: {type(exc).__name__}: {exc}")
            log(notes[-1])

    add_comparisons(rows, details, greedy)
    print_table(rows)
    for n in notes:
        print(f"note: {n}")

    result = {
        "meta": {**machine_info(args), "args": {k: v for k, v in vars(args).items() if k != "api_key"},
                 "servers": servers},
        "rows": [asdict(r) for r in rows],
        "notes": notes,
        "requests": details,
    }
    json_path = out_dir / f"bench-{stamp}.json"
    json_path.write_text(json.dumps(result, indent=2, default=str))
    print(f"wrote {json_path}")
    if rows and not args.no_chart:
        png_path = json_path.with_suffix(".png")
        served = {v.get("model") for v in servers.values() if v.get("model")}
        model_name = ", ".join(sorted(served)) or (Path(args.model).name if args.model else "default pair")
        write_chart(rows, png_path, f"specdec bench {stamp}: {model_name}, max_tokens {args.max_tokens}, "
                                    f"{'greedy' if greedy else f'T={args.temperature}'}")
        print(f"wrote {png_path}")
    return 0 if rows and not any(r.failed for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
