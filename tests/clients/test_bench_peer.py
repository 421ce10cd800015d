"""``bench.py`` against the shared tiny server: ``--peer`` (another OpenAI-compatible server
measured on the same workload, beside ours; here a second address of the same server, so no
third-party binary is needed), and ``--pairing same`` with its cache salts, per-proposer counts
and ``--control``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

CLIENTS = Path(__file__).resolve().parents[2] / "clients"


def run_bench(url: str, out: Path, *flags: str) -> dict:
    """``bench.py --url URL FLAGS`` at concurrency 1 unless FLAGS say otherwise, no baselines or
    chart; its JSON result."""
    cmd = [sys.executable, str(CLIENTS / "bench.py"), "--url", url, "--concurrency", "1", *flags,
           "--no-baselines", "--no-chart", "--out", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600)
    (result,) = out.glob("bench-*.json")
    return json.loads(result.read_text())


def test_peer_rows_sit_beside_ours(tiny_server, tmp_path: Path) -> None:
    data = run_bench(tiny_server.url, tmp_path, "--modes", "off", "--peer", f"other={tiny_server.url}",
                     "--kinds", "open", "--num-prompts", "1", "--max-tokens", "6")
    rows = {r["mode"]: r for r in data["rows"]}
    assert set(rows) == {"off", "peer:other"}
    peer = rows["peer:other"]
    assert peer["failed"] == 0 and peer["output_tokens"] > 0 and peer["ttft_p50_ms"] is not None
    assert peer["ratio_to_off"] is not None
    # Greedy, same server: the peer's text equals ours, which is what the 'same' column checks.
    assert peer["same_as_off"] == "1/1"
    assert data["meta"]["servers"]["peer:other"]["url"] == tiny_server.url


def test_same_server_pairing_gives_both_arms_the_same_cache_and_counts_each_proposer(tiny_server, tmp_path: Path) -> None:
    """``--pairing same`` against a running server: each arm has its own ``cache_salt``, so the
    prefix cache serves both arms of a unit alike (before, the arm run second found the unit's
    prompt cached: code_edit prompts span several blocks); what each proposer drafted, read from
    ``/metrics`` around the on arm, adds up to the responses' own totals (nothing else ran
    meanwhile)."""
    data = run_bench(tiny_server.url, tmp_path, "--pairing", "same", "--kinds", "code_edit", "--num-prompts", "3",
                     "--max-tokens", "8")
    (cell,) = data["paired"]
    assert cell["units"] == 3 and cell["same_as_off"] == "3/3" and cell["failed"] == 0
    units = data["requests"]
    assert [u["on_cached_tokens"] for u in units] == [u["off_cached_tokens"] for u in units]
    for u in units:
        assert sum(d for d, _ in u["on_by_source"].values()) == u["on_draft_tokens"]
        assert sum(a for _, a in u["on_by_source"].values()) == u["on_accepted_tokens"]
        assert u["off_by_source"] == {} and u["off_draft_tokens"] == 0 and u["off_trees"] == [0, 0]
    assert sum(d for d, _ in cell["by_source"].values()) == sum(u["on_draft_tokens"] for u in units) > 0
    assert cell["trees"] == [sum(u["on_trees"][i] for u in units) for i in (0, 1)]  # token trees, reported apart


def test_clients_that_run_several_prompts_each_send_every_prompt_of_a_unit_once_per_arm(tiny_server, tmp_path: Path) -> None:
    """``--prompts-per-stream 2`` at 2 streams: one unit of 4 prompts, each answered once per arm."""
    data = run_bench(tiny_server.url, tmp_path, "--pairing", "same", "--kinds", "open", "--num-prompts", "5",
                     "--concurrency", "2", "--prompts-per-stream", "2", "--max-tokens", "6")
    (cell,) = data["paired"]
    assert cell["units"] == 1 and cell["same_as_off"] == "1/1" and cell["failed"] == 0
    (unit,) = data["requests"]
    assert unit["prompts"] == [0, 1, 2, 3] and unit["on_tokens"] == unit["off_tokens"] == 4 * 6


def test_an_a_a_control_run_sends_no_speculation_in_either_arm(tiny_server, tmp_path: Path) -> None:
    """``--control``: both arms with speculation off, so the cell measures the bench itself."""
    data = run_bench(tiny_server.url, tmp_path, "--control", "--kinds", "open", "--num-prompts", "2", "--max-tokens", "6")
    (cell,) = data["paired"]
    assert cell["mode"] == "A/A" and cell["units"] == 2 and cell["same_as_off"] == "2/2" and cell["by_source"] == {}
    assert all(u[f"{arm}_draft_tokens"] == 0 and u[f"{arm}_tokens"] > 0 for u in data["requests"] for arm in ("on", "off"))
