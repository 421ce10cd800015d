"""Speculation on vs off on one server: interleaved units, ratios with bootstrap intervals.

Two servers started minutes apart differ by up to +-30% per cell on a shared machine, ten times
the effect worth detecting. Here both arms run on the same server (off is the per-request
extension ``"speculative": false``): each cell's prompts are cut into units (one prompt or
session at concurrency 1, ``c`` of them at once above), the units run in a random order, and each
unit runs in both arms back to back in a random order, so drift in the machine's load hits both
arms alike. With ``--prompts-per-stream M`` a unit has ``c * M`` prompts and ``c`` clients, each
sending its next prompt as soon as its last one finished (vLLM's ``--max-concurrency``): a burst
of ``c`` (M = 1) ends with its slowest request, and the requests speculation finished early leave
their slots idle until then, which closed-loop traffic does not do. A cell's ratio is (on tokens
/ on seconds) / (off tokens / off seconds) over its units; its 95% interval comes from
resampling the units (paired, with replacement).

Each unit's prompts are used once per arm: repeating a prompt would let a suffix trie find the
whole answer of the earlier run, a gain real traffic does not see that way (a request with
speculation off does not feed the server's global trie, so the off arm cannot leak it either).

Each arm has its own prefix cache: every request of an arm carries that arm's ``cache_salt``
(fresh per run and per cell, since the cells of a kind share prompts). Without it the arm that
ran second found its unit's prompts cached and skipped their prefill, and with two to five units
per cell that order, not speculation, decided the cell (code_edit at c=4: 0.54-0.60
when on ran first, 1.36-1.51 when off did). With a salt per arm, both arms of a unit meet the
same cache: the prompts of every earlier unit's same arm (a shared system prompt stays cached,
as in real traffic), never this unit's.

Around each arm the bench reads ``/metrics`` and keeps what each proposer drafted and had
accepted (``auto`` chooses per request and step, and the response's totals do not say which).
"""

from __future__ import annotations

import random
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

from .progress import log
from .report import fmt
from .results import RequestResult
from .workload import Workload, auth_headers, run_clients, warm_up

ARMS = ("on", "off")
OFF = {"speculative": False}
BY_SOURCE = {"specdec_spec_decode_draft_tokens_by_source": 0, "specdec_spec_decode_accepted_tokens_by_source": 1}
# Token trees, reported beside the proposers: verify passes of a tree / accepted tokens off its first chain.
TREES = "trees"
TREE_COUNTERS = {"specdec_spec_decode_tree_passes": 0, "specdec_spec_decode_tree_branch_tokens": 1}


@dataclass
class Arm:
    """One arm of one unit: output tokens, wall seconds and the server's speculation reports."""

    tokens: int = 0
    seconds: float = 0.0
    cached_tokens: int = 0  # prompt tokens the prefix cache served: equal in both arms of a unit
    draft_tokens: int = 0
    accepted_tokens: int = 0
    failed: int = 0
    texts: list[str] = field(default_factory=list)
    by_source: dict[str, list[int]] = field(default_factory=dict)  # proposer -> [drafted, accepted]
    trees: list[int] = field(default_factory=lambda: [0, 0])  # token-tree verify passes, accepted tokens off-chain


@dataclass
class Unit:
    kind: str
    concurrency: int
    workloads: list[Workload]
    arms: dict[str, Arm] = field(default_factory=dict)


@dataclass
class PairedRow:
    mode: str
    kind: str
    concurrency: int
    units: int
    on_tok_s: float
    off_tok_s: float
    ratio: float
    ratio_lo: float
    ratio_hi: float
    acceptance_rate: float | None
    same_as_off: str
    failed: int
    by_source: dict[str, list[int]] = field(default_factory=dict)
    trees: list[int] = field(default_factory=lambda: [0, 0])


def ratio(units: list[Unit]) -> float:
    on = sum(u.arms["on"].tokens for u in units) / max(sum(u.arms["on"].seconds for u in units), 1e-9)
    off = sum(u.arms["off"].tokens for u in units) / max(sum(u.arms["off"].seconds for u in units), 1e-9)
    return on / off if off > 0 else 0.0


def bootstrap_interval(units: list[Unit], resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """The 2.5th and 97.5th percentiles of the ratio over units resampled with replacement (the
    two arms of a unit stay together)."""
    rng = random.Random(seed)
    values = sorted(ratio([rng.choice(units) for _ in units]) for _ in range(resamples))
    return values[int(0.025 * (resamples - 1))], values[int(0.975 * (resamples - 1))]


def make_units(workloads: dict[str, list[Workload]], concurrency: list[int], per_stream: int = 1) -> list[Unit]:
    """Per cell, its prompts (or sessions) cut into units of ``c * per_stream``; a last short unit
    is dropped, since it would not load the server to ``c`` for as long as the others."""
    units = []
    for kind, wls in workloads.items():
        for c in concurrency:
            size = c * per_stream
            for start in range(0, len(wls), size):
                group = wls[start:start + size]
                if len(group) == size:
                    units.append(Unit(kind, c, group))
    return units


async def speculation_by_source(client: httpx.AsyncClient) -> dict[str, list[int]]:
    """The server's ``/metrics`` counters: proposer -> [draft tokens, accepted tokens] so far, and
    ``TREES`` -> [tree verify passes, accepted tokens off a tree's first chain]."""
    r = await client.get("/metrics")
    r.raise_for_status()
    counts: dict[str, list[int]] = {}
    for family in text_string_to_metric_families(r.text):
        column = BY_SOURCE.get(family.name, TREE_COUNTERS.get(family.name))
        if column is None:
            continue
        for sample in family.samples:
            if sample.name.endswith("_total"):
                source = sample.labels.get("source", TREES)
                counts.setdefault(source, [0, 0])[column] += int(sample.value)
    return counts


async def _run_arm(client: httpx.AsyncClient, unit: Unit, model: str, args, extra: dict) -> Arm:
    before = await speculation_by_source(client)
    start = time.perf_counter()
    batches = await run_clients(client, unit.workloads, unit.concurrency, model, args, extra)
    arm = Arm(seconds=time.perf_counter() - start)
    after = await speculation_by_source(client)
    for source, (drafted, accepted) in after.items():
        was = before.get(source, [0, 0])
        if source == TREES:
            arm.trees = [drafted - was[0], accepted - was[1]]
        elif drafted > was[0]:
            arm.by_source[source] = [drafted - was[0], accepted - was[1]]
    results: list[RequestResult] = [r for batch in batches for r in batch]
    for r in results:
        if not r.ok:
            arm.failed += 1
            continue
        arm.tokens += r.completion_tokens or 0
        arm.cached_tokens += r.cached_tokens or 0
        arm.texts.append(r.text)
        if r.speculative:
            arm.draft_tokens += int(r.speculative.get("draft_tokens") or 0)
            arm.accepted_tokens += int(r.speculative.get("accepted_tokens") or 0)
    return arm


async def run_paired(base_url: str, mode: str, on_extra: dict, model: str, workloads: dict[str, list[Workload]],
                     args) -> tuple[list[PairedRow], list[dict]]:
    """Every unit in both arms, in random orders (``args.seed``); one row per cell."""
    rng = random.Random(args.seed)
    units = make_units(workloads, args.concurrency, args.prompts_per_stream)
    rng.shuffle(units)
    conns = max(args.concurrency) + 4
    limits = httpx.Limits(max_connections=conns, max_keepalive_connections=conns)
    timeout = httpx.Timeout(args.request_timeout, connect=30.0)
    run_id = secrets.token_hex(8)  # a second run against the same server starts cold too

    def extra(unit: Unit, arm: str) -> dict:
        return {**(on_extra if arm == "on" else OFF),
                "cache_salt": f"specdec-bench-{run_id}-{unit.kind}-c{unit.concurrency}-{arm}"}

    async with httpx.AsyncClient(base_url=base_url, headers=auth_headers(args), timeout=timeout, limits=limits) as client:
        await warm_up(client, model, args, list(workloads))
        for i, unit in enumerate(units):
            order = list(ARMS)
            rng.shuffle(order)
            for arm in order:
                unit.arms[arm] = await _run_arm(client, unit, model, args, extra(unit, arm))
            on, off = unit.arms["on"], unit.arms["off"]
            log(f"{mode} {unit.kind} c={unit.concurrency} unit {i + 1}/{len(units)} ({'/'.join(order)}): "
                f"on {on.tokens / max(on.seconds, 1e-9):.2f} tok/s, off {off.tokens / max(off.seconds, 1e-9):.2f}; "
                f"cached prompt tokens {on.cached_tokens}/{off.cached_tokens}; drafted/accepted {format_sources(on.by_source)}")
    return summarize_cells(mode, units, args), [
        {"mode": mode, "kind": u.kind, "concurrency": u.concurrency, "prompts": [w.index for w in u.workloads],
         **{f"{a}_{k}": v for a in ARMS for k, v in vars(u.arms[a]).items() if k != "texts"}} for u in units]


def summarize_cells(mode: str, units: list[Unit], args) -> list[PairedRow]:
    rows = []
    cells = sorted({(u.kind, u.concurrency) for u in units}, key=lambda kc: (list(dict.fromkeys(
        u.kind for u in units)).index(kc[0]), kc[1]))
    for kind, c in cells:
        cell = [u for u in units if (u.kind, u.concurrency) == (kind, c)]
        on = [u.arms["on"] for u in cell]
        off = [u.arms["off"] for u in cell]
        lo, hi = bootstrap_interval(cell, seed=args.seed)
        drafted = sum(a.draft_tokens for a in on)
        same = sum(a.texts == b.texts for a, b in zip(on, off))
        rows.append(PairedRow(
            mode, kind, c, len(cell),
            on_tok_s=round(sum(a.tokens for a in on) / max(sum(a.seconds for a in on), 1e-9), 3),
            off_tok_s=round(sum(a.tokens for a in off) / max(sum(a.seconds for a in off), 1e-9), 3),
            ratio=round(ratio(cell), 3), ratio_lo=round(lo, 3), ratio_hi=round(hi, 3),
            acceptance_rate=round(sum(a.accepted_tokens for a in on) / drafted, 4) if drafted else None,
            same_as_off=f"{same}/{len(cell)}", failed=sum(a.failed for a in on + off),
            by_source=merge_sources(a.by_source for a in on),
            trees=[sum(a.trees[0] for a in on), sum(a.trees[1] for a in on)]))
    return rows


def merge_sources(counts: Iterable[dict[str, list[int]]]) -> dict[str, list[int]]:
    """Per proposer, the drafted and accepted tokens summed over arms."""
    total: dict[str, list[int]] = {}
    for by_source in counts:
        for source, (drafted, accepted) in by_source.items():
            row = total.setdefault(source, [0, 0])
            row[0] += drafted
            row[1] += accepted
    return total


def format_sources(by_source: dict[str, list[int]]) -> str:
    return ", ".join(f"{s} {d}/{a}" for s, (d, a) in sorted(by_source.items())) or "none"


def print_paired(rows: list[PairedRow]) -> None:
    head = (f"{'mode':<8} {'kind':<9} {'conc':>4} {'units':>5} {'on tok/s':>9} {'off tok/s':>9} "
            f"{'on/off':>7} {'95% interval':>15} {'accept':>6} {'same':>6}")
    print()
    print("one server per mode, speculation on vs off per request, units interleaved in random order; "
          "interval: bootstrap over units; same = units whose greedy outputs equal off's")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r.mode:<8} {r.kind:<9} {r.concurrency:>4} {r.units:>5} {r.on_tok_s:>9.2f} {r.off_tok_s:>9.2f} "
              f"{r.ratio:>7.3f} {f'[{r.ratio_lo:.3f}, {r.ratio_hi:.3f}]':>15} "
              f"{fmt(r.acceptance_rate, '.2f'):>6} {r.same_as_off:>6}")
    print("drafted/accepted tokens by proposer; token-tree passes and accepted tokens off their first chain "
          "(on arms, from /metrics):")
    for r in rows:
        print(f"  {r.mode} {r.kind} c={r.concurrency}: {format_sources(r.by_source)}; "
              f"trees {r.trees[0]} passes, {r.trees[1]} branch tokens")
    print()
