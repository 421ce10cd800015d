#!/usr/bin/env python3
"""Benchmark specdec: speculation off vs draft model vs n-gram vs suffix vs auto, against same-run
baselines and peers.

By default (``--pairing same``) every speculating mode is measured against speculation off *on
the same server*: off is the per-request extension ``"speculative": false``, the prompts are cut
into units that run in a random order, each unit in both arms back to back in a random order, and
each cell reports on/off with a bootstrap 95% interval over its units (``benchmark/paired.py``).
With ``--spawn`` each concurrency level gets its own server, since the levels share prompts.
``--pairing separate`` is the older design: one server per mode, off included, minutes apart.

Two ways to point it at a server:

    # start one server per speculation mode, measure it on vs off, stop it
    python clients/bench.py --spawn --model path/to/target --draft-model path/to/draft
    python clients/bench.py --spawn --modes ngram,suffix,auto --kinds agentic,code_edit --concurrency 1
    python clients/bench.py --spawn --quick --model SmolLM2-135M-Instruct.Q4_1.gguf --max-model-len 1024

    # a server that is already running: its --speculative-method is fixed, so only its own method
    # (on vs off) can be measured
    python clients/bench.py --url http://127.0.0.1:8000

    # beside either: any other OpenAI-compatible server on the same prompts, e.g. llama.cpp's
    # llama-server started by you (docs/benchmarks.md, "Against llama.cpp"); rows are named peer:NAME
    python clients/bench.py --spawn --peer llama.cpp-md=http://127.0.0.1:8081

Kinds: code_edit, open and chat from clients/prompts.json; agentic: multi-turn coding-agent sessions
from clients/agentic.json (every turn re-sends the history and asks for the file again as a tool
call; ``--agentic-max-tokens`` per turn).

With ``--pairing separate``, for every (mode, prompt kind, concurrency) it streams the prompt set with
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

The code lives in ``clients/benchmark/``: ``workload`` (prompts, the streaming client), ``servers``
(spawned servers), ``baselines`` (transformers), ``report`` (summaries, table, chart); this file
parses the command line and runs them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import sys
import time
from dataclasses import asdict
from pathlib import Path

import httpx
from benchmark.baselines import run_baselines
from benchmark.modes import BASELINES, MODES, NEEDS_DRAFT
from benchmark.paired import PairedRow, print_paired, run_paired
from benchmark.progress import log
from benchmark.report import Row, add_comparisons, machine_info, print_table, write_chart
from benchmark.servers import SpawnedServer
from benchmark.workload import KINDS, bench_server, load_workloads, server_info


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Benchmark specdec speculation modes against transformers baselines.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument("--url", default=None, help="base URL of a running server (default http://127.0.0.1:8000)")
    where.add_argument("--spawn", action="store_true", help="start one server per mode on free loopback ports")
    p.add_argument("--pairing", choices=("same", "separate"), default=None,
                   help="same: each mode on vs off on one server, interleaved, ratios with bootstrap intervals "
                        "(default); separate: one server per mode, off included (the default with --peer, "
                        "whose rows are compared with an off row)")
    p.add_argument("--control", action="store_true",
                   help="with --pairing same: an A/A run, both arms with speculation off; its ratios show the "
                        "paired bench's own bias and spread on this machine (1.0 if it has none)")

    g = p.add_argument_group("models (--spawn and baselines)")
    g.add_argument("--model", default=None, help="target: HF dir, cached hub id or .gguf (default: embedded pair)")
    g.add_argument("--draft-model", default=None, help="draft model (needed for the draft mode unless default pair)")
    g.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    g.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    g.add_argument("--quantize", default="auto", choices=["auto", "none", "int8", "gguf"],
                   help="the servers' --quantize (default auto: on the CPU a GGUF model's own blocks, else "
                        "Q8_0 blocks made at load); the transformers baselines get torch's dynamic int8 for int8 and "
                        "gguf, its closest equivalent")
    g.add_argument("--max-model-len", type=int, default=None)
    g.add_argument("--max-num-seqs", type=int, default=None, help="default: the largest concurrency level")
    g.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                   help="extra argument(s) for every spawned server, e.g. --server-arg='--log-level warning'")
    g.add_argument("--startup-timeout", type=float, default=3600.0,
                   help="seconds to wait for /health (the first start converts GGUF weights)")

    w = p.add_argument_group("workload")
    w.add_argument("--modes", default=",".join(MODES), help="comma list of " + ",".join(MODES))
    w.add_argument("--peer", action="append", default=[], metavar="[NAME=]URL",
                   help="another OpenAI-compatible server to measure on the same workload after ours "
                        "(repeatable); its rows are named peer:NAME and compared with our 'off'")
    w.add_argument("--kinds", default=",".join(KINDS), help="comma list of " + ",".join(KINDS))
    w.add_argument("--concurrency", default="1,4,16", help="comma list of concurrency levels")
    w.add_argument("--num-prompts", type=int, default=10,
                   help="prompts per kind, the first N of clients/prompts.json (48 per kind; default 10, the set "
                        "the earlier recorded runs used; --pairing same needs c of them per unit at concurrency c)")
    w.add_argument("--prompts-per-stream", type=int, default=1, metavar="M",
                   help="--pairing same: each unit at concurrency c is c clients running M prompts each, a "
                        "client's next one as soon as its last one finished (default 1: a burst of c, which ends "
                        "with its slowest request)")
    w.add_argument("--requests-per-level", type=int, default=None,
                   help="requests per (mode, kind, concurrency) (default: max(num prompts, concurrency))")
    w.add_argument("--max-tokens", type=int, default=128)
    w.add_argument("--agentic-max-tokens", type=int, default=256, help="max_tokens of each agentic turn")
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
                   help="2 prompts per kind, 32 tokens (agentic turns 96), concurrency 1,4 (unless set explicitly)")

    args = p.parse_args(argv)
    given = {a.split("=")[0] for a in (argv if argv is not None else sys.argv[1:]) if a.startswith("--")}
    if args.quick:
        if "--num-prompts" not in given:
            args.num_prompts = 2
        if "--max-tokens" not in given:
            args.max_tokens = 32
        if "--concurrency" not in given:
            args.concurrency = "1,4"
        if "--agentic-max-tokens" not in given:
            args.agentic_max_tokens = 96
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
    args.peer = [_peer(p_, i) for i, p_ in enumerate(args.peer)]
    if args.pairing is None:
        args.pairing = "separate" if args.peer else "same"
    if args.pairing == "same" and not args.control and set(args.modes) <= {"off"}:
        p.error("--pairing same measures each speculating mode against off on one server, so --modes off alone "
                "measures nothing: add a mode (ngram, suffix, draft, auto), or --pairing separate, or --control")
    if args.control and args.pairing != "same":
        p.error("--control is an A/A run of --pairing same")
    if args.prompts_per_stream < 1 or (args.prompts_per_stream > 1 and args.pairing != "same"):
        p.error("--prompts-per-stream takes an integer >= 1 and shapes the units of --pairing same")
    # Spawned servers run from the repository root: make local model paths absolute first.
    for name in ("model", "draft_model"):
        value = getattr(args, name)
        if value and os.path.exists(value):
            setattr(args, name, os.path.abspath(value))
    return args


def _peer(value: str, index: int) -> tuple[str, str]:
    """``NAME=URL`` or a bare URL (named peer1, peer2, ...)."""
    name, sep, url = value.partition("=")
    if not sep or "://" in name:
        name, url = f"peer{index + 1}", value
    return name, url.rstrip("/")


def _csv(value: str, allowed: tuple[str, ...], flag: str) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    bad = [v for v in items if v not in allowed]
    if bad:
        raise SystemExit(f"{flag}: unknown {bad}; choose from {','.join(allowed)}")
    return items


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

    paired: list[PairedRow] = []
    if args.pairing == "same":
        paired = _run_same_server(args, workloads, servers, details, notes)
    elif args.spawn:
        rows += _each_spawned(args, args.modes, servers, details, notes, lambda url, mode, model: asyncio.run(
            bench_server(url, mode, {}, model, workloads, args)))
    else:
        model, method = asyncio.run(server_info(args.url, args))
        log(f"server at {args.url} serves {model!r} with speculative method {method!r}")
        servers["url"] = {"url": args.url, "model": model, "method": method}
        for mode in args.modes:
            if mode == "off":
                extra: dict = {"speculative": False}
            elif method == mode:
                extra = _on_extra(args)
            else:
                notes.append(f"{mode} mode skipped: the server at {args.url} runs method {method!r} (its method is "
                             f"fixed at start; restart it with --speculative-method {mode}, or use --spawn)")
                log(notes[-1])
                continue
            mode_rows, mode_details = asyncio.run(bench_server(args.url, mode, extra, model, workloads, args))
            rows += mode_rows
            details += mode_details

    for name, url in args.peer:
        mode = f"peer:{name}"
        try:
            model, _ = asyncio.run(server_info(url, args))
            log(f"peer {name} at {url} serves {model!r}")
            servers[mode] = {"url": url, "model": model}
            mode_rows, mode_details = asyncio.run(bench_server(url, mode, {}, model, workloads, args))
            rows += mode_rows
            details += mode_details
        except (RuntimeError, httpx.HTTPError, KeyError, IndexError) as exc:
            notes.append(f"peer {name} at {url} failed: {type(exc).__name__}: {exc}")
            log(notes[-1])

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
    if rows:
        print_table(rows)
    if paired:
        print_paired(paired)
    for n in notes:
        print(f"note: {n}")

    result = {
        "meta": {**machine_info(args), "args": {k: v for k, v in vars(args).items() if k != "api_key"},
                 "servers": servers},
        "rows": [asdict(r) for r in rows],
        "paired": [asdict(r) for r in paired],
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
    return 0 if (rows or paired) and not any(r.failed for r in [*rows, *paired]) else 1


def _on_extra(args) -> dict:
    return {} if args.num_speculative_tokens is None else {"num_speculative_tokens": args.num_speculative_tokens}


def _paired_extra(args) -> dict:
    """What the 'on' arm of --pairing same adds to its requests (with --control: speculation off)."""
    return {"speculative": False} if args.control else _on_extra(args)


def _run_same_server(args, workloads, servers: dict, details: list, notes: list) -> list[PairedRow]:
    """Each speculating mode on vs off on one server: spawned per mode and concurrency level, or
    the one at --url.

    Every level cuts its units from the same prompts, so on one server a later level's 'on' arm
    could find an earlier level's answers in the global suffix trie (chat at c=4 after c=16
    accepted 169 of 214 suffix drafts), and its prefix cache would serve whichever arm's blocks
    were freed last. A fresh server per level has neither."""
    if not args.spawn:
        model, method = asyncio.run(server_info(args.url, args))
        log(f"server at {args.url} serves {model!r} with speculative method {method!r}: {method} vs off")
        servers["url"] = {"url": args.url, "model": model, "method": method}
        if len(args.concurrency) > 1:
            notes.append("one server for several concurrency levels: a later level's suffix proposals may copy an "
                         "earlier level's answers to the same prompts; run one --concurrency per server, or --spawn")
            log(notes[-1])
        label = "A/A" if args.control else method or "on"
        cells, unit_details = asyncio.run(run_paired(args.url, label, _paired_extra(args), model, workloads, args))
        details += unit_details
        return cells
    modes = [m for m in args.modes if m != "off"]  # off is measured beside every other mode
    cells: list[PairedRow] = []
    for c in args.concurrency:
        level = argparse.Namespace(**{**vars(args), "concurrency": [c]})
        cells += _each_spawned(level, modes, servers, details, notes, lambda url, mode, model, level=level: asyncio.run(
            run_paired(url, f"{mode} A/A" if args.control else mode, _paired_extra(level), model, workloads, level)),
            name=f"-c{c}")
    return cells


def _each_spawned(args, modes: list[str], servers: dict, details: list, notes: list, measure, name: str = "") -> list:
    """One spawned server per mode, measured by ``measure(url, mode, model) -> (rows, details)``
    and stopped; a server that fails becomes a note. ``name``: appended to the mode in the
    server's log file and its entry in ``servers``."""
    rows: list = []
    for mode in modes:
        if mode in NEEDS_DRAFT and args.model and not args.draft_model:
            notes.append(f"{mode} mode skipped: --model given without --draft-model")
            log(notes[-1])
            continue
        server = SpawnedServer(mode, args, Path(args.out), name)
        try:
            server.start()
            server.wait_ready(args.startup_timeout)
            model, method = asyncio.run(server_info(server.url, args))
            servers[mode + name] = {"cmd": server.cmd, "model": model, "method": method}
            mode_rows, mode_details = measure(server.url, mode, model)
            rows += mode_rows
            details += mode_details
        except (RuntimeError, httpx.HTTPError) as exc:
            notes.append(f"{mode} server failed: {exc}")
            log(notes[-1])
        finally:
            server.stop()
    return rows


if __name__ == "__main__":
    sys.exit(main())
