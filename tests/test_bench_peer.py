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
