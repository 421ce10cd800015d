"""The bench runs from a checkout as a script (its package next to it, no install) and summarizes
streamed results; the real end-to-end run is the documented ``--spawn --quick`` command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CLIENTS = Path(__file__).resolve().parents[1] / "clients"


def test_bench_help_runs_from_any_directory(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, str(CLIENTS / "bench.py"), "--help"], cwd=tmp_path,
                         capture_output=True, text=True, check=True).stdout
    assert "--spawn" in out and "--no-baselines" in out


def test_summary_of_streamed_results() -> None:
    sys.path.insert(0, str(CLIENTS))
    try:
        from benchmark.report import summarize
        from benchmark.workload import RequestResult
    finally:
        sys.path.remove(str(CLIENTS))
    ok = RequestResult("open", 0, ok=True, ttft=0.1, chunk_times=[0.1, 0.2, 0.4], completion_tokens=5,
                       speculative={"draft_tokens": 8, "accepted_tokens": 6, "steps": 2, "mean_accepted_length": 3.0})
    failed = RequestResult("open", 1, error="HTTP 500: boom")
    row = summarize("ngram", "open", 1, [ok, failed], duration=1.0)
    assert (row.requests, row.failed, row.output_tokens, row.output_tok_s) == (2, 1, 5, 5.0)
    assert row.ttft_p50_ms == 100.0 and row.tpot_p50_ms == 75.0 and row.acceptance_rate == 0.75
    assert row.errors == ["HTTP 500: boom"]
