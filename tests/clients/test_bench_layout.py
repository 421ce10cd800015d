"""The bench runs from a checkout as a script (its package next to it, no install) and summarizes
streamed results; the real end-to-end run is the documented ``--spawn --quick`` command."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

CLIENTS = Path(__file__).resolve().parents[2] / "clients"


def test_bench_help_runs_from_any_directory(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, str(CLIENTS / "bench.py"), "--help"], cwd=tmp_path,
                         capture_output=True, text=True, check=True).stdout
    assert "--spawn" in out and "--no-baselines" in out


def test_a_same_server_run_of_off_alone_is_refused_before_anything_starts(tmp_path: Path) -> None:
    """Same-server pairing measures each speculating mode against off: off alone used to run, print
    no row and exit 1 without saying why."""
    done = subprocess.run([sys.executable, str(CLIENTS / "bench.py"), "--spawn", "--modes", "off"], cwd=tmp_path,
                          capture_output=True, text=True)
    assert done.returncode == 2 and "--modes off alone measures nothing" in done.stderr


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


def _bench_modules():
    sys.path.insert(0, str(CLIENTS))
    try:
        from benchmark import agentic, paired, workload
    finally:
        sys.path.remove(str(CLIENTS))
    return agentic, paired, workload


def test_paired_ratio_and_its_bootstrap_interval() -> None:
    _, paired, workload = _bench_modules()
    Workload = workload.Workload

    def unit(on_s: float, off_s: float) -> "paired.Unit":
        u = paired.Unit("code_edit", 1, [Workload("code_edit", 0, "p")])
        u.arms = {"on": paired.Arm(tokens=100, seconds=on_s), "off": paired.Arm(tokens=100, seconds=off_s)}
        return u

    steady = [unit(1.0, 2.0) for _ in range(8)]
    assert paired.ratio(steady) == 2.0 and paired.bootstrap_interval(steady) == (2.0, 2.0)
    noisy = [unit(1.0, off) for off in (1.0, 1.5, 2.0, 2.5, 3.0, 1.2, 2.2, 2.8)]
    lo, hi = paired.bootstrap_interval(noisy)
    assert lo < paired.ratio(noisy) < hi and 1.0 <= lo and hi <= 3.0
    # Units: one prompt each at c=1; groups of c above, a short last group dropped.
    wls = {"code_edit": [Workload("code_edit", i, "p") for i in range(5)]}
    units = paired.make_units(wls, [1, 2])
    assert [(u.concurrency, [w.index for w in u.workloads]) for u in units] == [
        (1, [0]), (1, [1]), (1, [2]), (1, [3]), (1, [4]), (2, [0, 1]), (2, [2, 3])]
    # --prompts-per-stream 2: c clients with 2 prompts each per unit
    assert [[w.index for w in u.workloads] for u in paired.make_units(wls, [2], per_stream=2)] == [[0, 1, 2, 3]]


def test_closed_loop_clients_return_results_in_the_workloads_order(monkeypatch) -> None:
    """Clients finish out of order (the first prompt waits until the second one is answered);
    the results still come back in the prompts' order, which the on/off output check relies on."""
    _, _, workload = _bench_modules()
    second_done = asyncio.Event()
    finished: list[int] = []

    async def answer(client, wl, model, args, extra):
        if wl.index == 0:
            await second_done.wait()
        if wl.index == 1:
            second_done.set()
        finished.append(wl.index)
        return [workload.RequestResult(wl.kind, wl.index, ok=True)]

    monkeypatch.setattr(workload, "run_workload", answer)
    wls = [workload.Workload("open", i, "p") for i in range(4)]
    batches = asyncio.run(workload.run_clients(None, wls, 2, "m", None, {}))
    assert finished[0] == 1 and finished != sorted(finished)
    assert [[r.prompt_index for r in batch] for batch in batches] == [[0], [1], [2], [3]]


def test_an_agentic_session_resends_its_history_and_answers() -> None:
    import asyncio

    agentic, _, _ = _bench_modules()
    from benchmark.results import RequestResult

    sessions = agentic.load_sessions()
    assert len(sessions) >= 6 and all(len(s["turns"]) == 4 for s in sessions)
    assert sessions[0]["path"] in sessions[0]["turns"][0]
    assert not any("{path}" in t or "{old}" in t for s in sessions for t in s["turns"])  # templates filled
    seen: list[list[dict]] = []

    async def send(messages):
        seen.append(messages)
        return RequestResult("agentic", 0, ok=True, text=f"answer {len(seen)}")

    results = asyncio.run(agentic.run_session(sessions[0], send))
    assert len(results) == 4
    assert [m["content"] for m in seen[3] if m["role"] == "assistant"] == ["answer 1", "answer 2", "answer 3"]
    assert [m["content"] for m in seen[3] if m["role"] == "user"] == sessions[0]["turns"]
