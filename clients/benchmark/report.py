"""Reporting: per-level summaries (throughput, latency percentiles, acceptance), comparisons with
speculation off, the printed table, the chart and the machine description for the JSON."""

from __future__ import annotations

import datetime as _dt
import math
import os
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .modes import BASELINES

if TYPE_CHECKING:  # workload imports this module; the type is only a hint here
    from .results import RequestResult


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


def fmt(x, spec: str = ".1f") -> str:
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
              f"{fmt(r.ratio_to_off, '.2f'):>6} {fmt(r.ttft_p50_ms):>9} {fmt(r.ttft_p99_ms):>8} "
              f"{fmt(r.itl_p50_ms):>8} {fmt(r.itl_p99_ms):>8} {fmt(r.tpot_p50_ms):>9} "
              f"{fmt(r.acceptance_rate, '.2f'):>6} {fmt(r.mean_accepted_length, '.2f'):>7} "
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
