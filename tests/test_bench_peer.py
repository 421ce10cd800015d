"""``bench.py --peer``: another OpenAI-compatible server measured on the same workload, in the same
run, beside ours. Here the peer is a second address of the shared tiny server, so the test needs
no third-party binary; its rows must carry real streamed numbers and compare with our 'off'."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

CLIENTS = Path(__file__).resolve().parents[1] / "clients"


def test_peer_rows_sit_beside_ours(tiny_server, tmp_path: Path) -> None:
    cmd = [sys.executable, str(CLIENTS / "bench.py"), "--url", tiny_server.url, "--modes", "off",
           "--peer", f"other={tiny_server.url}", "--kinds", "open", "--concurrency", "1", "--num-prompts", "1",
           "--max-tokens", "6", "--no-baselines", "--no-chart", "--out", str(tmp_path)]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600)
    (result,) = tmp_path.glob("bench-*.json")
    data = json.loads(result.read_text())
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
    prompt cached: code_edit prompts span several blocks); what each proposer drafted, read from ``/metrics`` around the on arm, adds up to the
    responses' own totals (nothing else ran meanwhile)."""
    cmd = [sys.executable, str(CLIENTS / "bench.py"), "--url", tiny_server.url, "--pairing", "same",
           "--kinds", "code_edit", "--concurrency", "1", "--num-prompts", "3", "--max-tokens", "8",
           "--no-baselines", "--no-chart", "--out", str(tmp_path)]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600)
    (result,) = tmp_path.glob("bench-*.json")
    data = json.loads(result.read_text())
    (cell,) = data["paired"]
    assert cell["units"] == 3 and cell["same_as_off"] == "3/3" and cell["failed"] == 0
    units = data["requests"]
    assert [u["on_cached_tokens"] for u in units] == [u["off_cached_tokens"] for u in units]
    for u in units:
        assert sum(d for d, _ in u["on_by_source"].values()) == u["on_draft_tokens"]
        assert sum(a for _, a in u["on_by_source"].values()) == u["on_accepted_tokens"]
        assert u["off_by_source"] == {} and u["off_draft_tokens"] == 0
    assert sum(d for d, _ in cell["by_source"].values()) == sum(u["on_draft_tokens"] for u in units) > 0


def test_an_a_a_control_run_sends_no_speculation_in_either_arm(tiny_server, tmp_path: Path) -> None:
    """``--control``: both arms with speculation off, so the cell measures the bench itself."""
    cmd = [sys.executable, str(CLIENTS / "bench.py"), "--url", tiny_server.url, "--control", "--kinds", "open",
           "--concurrency", "1", "--num-prompts", "2", "--max-tokens", "6", "--no-baselines", "--no-chart",
           "--out", str(tmp_path)]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600)
    (result,) = tmp_path.glob("bench-*.json")
    data = json.loads(result.read_text())
    (cell,) = data["paired"]
    assert cell["mode"] == "A/A" and cell["units"] == 2 and cell["same_as_off"] == "2/2" and cell["by_source"] == {}
    assert all(u[f"{arm}_draft_tokens"] == 0 and u[f"{arm}_tokens"] > 0 for u in data["requests"] for arm in ("on", "off"))
