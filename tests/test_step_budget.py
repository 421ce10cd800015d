"""Device work per engine step as a budget (``clients/step_counts.py``): kernel-launching ops and
host round trips of one steady step on the device code path (bf16, ``--quantize none``), with
random models of the default pair's depths.

On CUDA each op is a launch and each round trip a stall of the queue, so these counts are what a
GPU step costs before any arithmetic. Today's step attends one segment per draft token, so its
ops grow with requests x drafts; these budgets are today's counts (measured 2026-11-24, the same
as issue 21's table) and fail any change that adds to them. Issue 21's step makes them flat in
the batch and lowers the round trips to a handful, and will tighten these numbers.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "clients"))
from step_counts import build_models, counting, steady_step  # noqa: E402

# (batch, k) -> (kernel ops, host round trips) per steady greedy step, today.
BUDGET = {(1, 0): (1153, 8), (16, 0): (1993, 8), (16, 4): (12558, 56)}


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, smol_tokenizer_dir: Path) -> tuple[Path, Path]:
    return build_models(tmp_path_factory.mktemp("depth_pair"), smol_tokenizer_dir)


def test_the_counter_sees_ops_and_host_reads() -> None:
    import torch

    with counting() as c:
        x = torch.ones(4) + 1
        x.tolist()
        bool(x.sum() > 0)
    # ones, add, sum, gt and bool's device-to-host copy (_local_scalar_dense); tolist and bool
    assert c.ops == 5 and c.host_reads == 2
    assert set(c.by_op) == {"ones", "add", "sum", "gt", "_local_scalar_dense"}


@pytest.mark.parametrize("batch,k", sorted(BUDGET))
def test_a_steady_step_stays_within_its_launch_and_round_trip_budget(pair, batch: int, k: int) -> None:
    counts = steady_step(*pair, batch=batch, k=k)
    ops, round_trips = BUDGET[(batch, k)]
    assert counts.ops <= ops, f"{counts.ops} kernel ops > budget {ops}: {counts.by_op.most_common(6)}"
    assert counts.host_reads <= round_trips, f"{counts.host_reads} host round trips > budget {round_trips}"


def test_plain_decoding_reads_the_host_as_often_alone_as_in_a_crowd(pair) -> None:
    assert steady_step(*pair, batch=1, k=0).host_reads == steady_step(*pair, batch=16, k=0).host_reads
