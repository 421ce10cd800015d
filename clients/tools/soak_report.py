"""The soak's report: latency percentiles, server memory over time, the pass/fail verdict and its
printout (``soak.py`` runs the traffic; this module only summarises what it counted)."""

from __future__ import annotations

import argparse
import statistics
from collections import Counter
from typing import Any


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    qs = statistics.quantiles(values, n=100, method="inclusive") if len(values) > 1 else [values[0]] * 99
    return {"p50": round(qs[49], 3), "p90": round(qs[89], 3), "p99": round(qs[98], 3), "max": round(max(values), 3)}


def memory_summary(samples: list[tuple[float, float | None]]) -> dict[str, Any]:
    values = [rss for _, rss in samples if rss is not None]
    if not values:
        return {"samples": samples}
    quarter = max(1, len(values) // 4)
    return {
        "first_mib": round(values[0], 1), "last_mib": round(values[-1], 1),
        "min_mib": round(min(values), 1), "max_mib": round(max(values), 1),
        # median of the last quarter minus median of the first: growth that is not a spike
        "growth_mib": round(statistics.median(values[-quarter:]) - statistics.median(values[:quarter]), 1),
        "samples": samples,
    }


def print_report(report: dict[str, Any]) -> None:
    print(f"\nsoak: {report['duration_s']} s, concurrency {report['concurrency']}, {report['requests']} requests "
          f"({report['requests_per_s']}/s) against {report['url']}")
    print(f"{'kind':<14}{'count':>7}{'ok':>7}  errors{'':<22}latency s p50/p90/p99/max{'':<5}ttft s p50/p99")
    for kind, row in report["kinds"].items():
        lat, ttft = row["latency_s"], row["ttft_s"]
        lat_text = "/".join(str(lat[k]) for k in ("p50", "p90", "p99", "max")) if lat else "-"
        ttft_text = f"{ttft['p50']}/{ttft['p99']}" if ttft else "-"
        errors = ", ".join(f"{k}={v}" for k, v in row["errors"].items()) or "-"
        print(f"{kind:<14}{row['count']:>7}{row['ok']:>7}  {errors:<28}{lat_text:<31}{ttft_text}")
    mem = report["memory"]
    if "first_mib" in mem:
        print(f"server RSS MiB ({report['memory_source']}): first {mem['first_mib']}, min {mem['min_mib']}, "
              f"max {mem['max_mib']}, last {mem['last_mib']}, growth (last vs first quarter median) {mem['growth_mib']}")
        print("  over time: " + ", ".join(f"{t:.0f}s={v:.0f}" for t, v in mem["samples"] if v is not None))
    print(f"after the traffic: {report['after']}")
    print(f"errors: {dict(report['errors']) or 'none'}; server log error lines: {report['server_log_errors']}")
    print("RESULT: " + ("PASS" if report["passed"] else "FAIL: " + "; ".join(report["failures"])))


def build_report(soak: Any, args: argparse.Namespace, elapsed: float, samples: list, after: dict[str, float],
                 health: int, log_errors: int | None, memory_source: str, kinds_asked: list[str]) -> dict[str, Any]:
    kinds = {}
    for kind in kinds_asked:
        counts = soak.tally.outcomes.get(kind, Counter())
        kinds[kind] = {
            "count": sum(counts.values()), "ok": counts.get("ok", 0),
            "errors": {k: v for k, v in counts.items() if k != "ok"},
            "latency_s": percentiles(soak.tally.latency.get(kind, [])), "ttft_s": percentiles(soak.tally.ttft.get(kind, [])),
        }
    total = sum(row["count"] for row in kinds.values())
    errors = soak.tally.errors()
    failures = []
    if errors:
        failures.append(f"{sum(errors.values())} requests with errors")
    if any(v != 0.0 for k, v in after.items() if k != "process_open_fds"):
        failures.append(f"engine not idle after the traffic: {after}")
    if health != 200:
        failures.append(f"/health answered {health}")
    if log_errors:
        failures.append(f"{log_errors} error-level lines in the server log")
    return {
        "url": soak.url, "duration_s": round(elapsed, 1), "concurrency": args.concurrency, "seed": args.seed,
        "requests": total, "requests_per_s": round(total / elapsed, 2) if elapsed else 0.0, "kinds": kinds,
        "errors": errors, "memory_source": memory_source, "memory": memory_summary(samples), "after": after,
        "health_after": health, "server_log_errors": log_errors, "failures": failures, "passed": not failures,
    }
