"""``clients/tools/agent_speed.py`` against the agents' tiny server: it measures prefill at a given
length and replays a recorded Claude Code session turn by turn, speculation off and on, and every
row it reports is a measurement (no errors; later turns read the prefix cache)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.helpers.servers import ServerProcess

REPO = Path(__file__).resolve().parents[2]
SESSION = REPO / "tests" / "server" / "agent_requests" / "claude_code-2.1.328.jsonl.gz"


def test_agent_speed_replays_a_session(agent_server: ServerProcess, tmp_path: Path) -> None:
    out = tmp_path / "agent-speed.json"
    done = subprocess.run([sys.executable, str(REPO / "clients" / "tools" / "agent_speed.py"), "--url", agent_server.url,
                           "--prefill", "600", "--repeats", "1", "--session", str(SESSION), "--max-tokens", "8",
                           "--out", str(out)], capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads(out.read_text())
    [prefill] = results["prefill"]
    assert prefill["prompt_tokens"] > 300 and prefill["tokens_per_s"] > 0
    assert [s["speculation"] for s in results["sessions"]] == ["off", "on"]
    for session in results["sessions"]:
        turns = session["turns"]
        assert turns and all("error" not in t for t in turns), turns
        assert all(t["prompt_tokens"] > 1000 and t["ttft_s"] >= 0 for t in turns)
        assert max(t["cached_share"] for t in turns[1:]) > 0.5  # the history is read from the cache
