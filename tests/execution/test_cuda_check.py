"""``clients/tools/cuda_check.py`` is run where a GPU is lent, which CI never has: this runs it on the
CPU (``--tiny``) so that the script cannot rot between GPU sessions, and checks that every
configuration it reports served every request to the end and agreed with itself where it must."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from clients.tools import cuda_check


def test_cuda_check_runs_every_configuration_on_the_cpu(tiny_target: Path, tmp_path: Path) -> None:
    configs = tmp_path / "configs"
    for role in ("target", "draft"):
        shutil.copytree(tiny_target, configs / role)
    out = tmp_path / "report.json"
    assert cuda_check.main(["--configs", str(configs), "--tiny", "--batches", "2", "--max-tokens", "14",
                            "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["method"], r["k"], r["graphs"]) for r in rows][:3] == [("none", 0, "off"), ("none", 0, "off"), ("none", 0, "on")]
    assert len(rows) == 10 and all(r["completion_tokens"] == 2 * 14 for r in rows)
    # The CPU runs every row bit for bit alike: plain decoding with graphs on or off, and with
    # logprobs asked for, gives the reference's tokens.
    assert all(r["agreement"]["identical"] == 2 for r in rows[:3])
    # The probes ran (at step 10) wherever a fixed-k run lasted that long, plain decoding always.
    probed = [r for r in rows if r["adaptive"] is False and "counted_round_trips" in r]
    assert {(r["k"], r["graphs"]) for r in probed} >= {(0, "off"), (0, "on")}
    assert all(r["counted_round_trips"] == 2 and r["counted_ops"] > 0 for r in probed)
