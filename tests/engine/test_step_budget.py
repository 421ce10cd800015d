"""Device work per engine step as a budget (``clients/tools/step_counts.py``): kernel-launching ops and
host round trips of one steady step on the device code path (bf16, ``--quantize none``, the
packed attention CUDA runs), with random models of the default pair's depths.

On CUDA each op is a launch and each round trip a stall of the queue, so these counts are what a
GPU step costs before any arithmetic. Issue 21's step: attention is one call per layer for the
whole batch, draft tokens stay on the device between positions and into the verification, every
row's warping is one table of tensors, and the host uploads once and reads once per step. So the
counts do not grow with the batch, and a step makes two round trips whatever its size.
Measured 2026-11-24: 1,294 ops (k=0) and 5,752 (k=4) at B=1 and B=16 alike, 2 round trips;
before this step: 1,153 / 1,993 (k=0, B=1 / 16), 5,343 / 12,558 (k=4), 8 to 56 round trips.
With ``--decode-graphs on`` (the CUDA default: each forward's layers replayed as one captured
graph) a step launches 32 (k=0) and 142 (k=4; 181 sampled) at B=1 and B=16 alike.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from clients.tools.step_counts import DRAFT_LAYERS, TARGET_LAYERS, build_models, counting, steady_step

# (batch, k) -> kernel ops per steady step, today's counts with a little room.
OPS_BUDGET = {(1, 0): 1300, (16, 0): 1300, (1, 4): 5800, (16, 4): 5800}
MAX_ROUND_TRIPS = 4  # issue 21: at most 4 per step at B=16, k=4, greedy and sampled
# With the forwards' layers replayed as graphs: what a step launches on CUDA.
GRAPH_BUDGET = {(1, 0, 0.0): 40, (16, 4, 0.0): 160, (16, 4, 0.8): 200}


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, smol_tokenizer_dir: Path) -> tuple[Path, Path]:
    return build_models(tmp_path_factory.mktemp("depth_pair"), smol_tokenizer_dir)


@pytest.fixture(scope="module")
def steps(pair) -> dict:  # type: ignore[type-arg]
    """One counted steady step per (batch, k, temperature), shared by the tests below."""
    return {(b, k, t): steady_step(*pair, batch=b, k=k, temperature=t)
            for b, k, t in ((1, 0, 0.0), (16, 0, 0.0), (1, 4, 0.0), (16, 4, 0.0), (16, 4, 0.8))}


@pytest.fixture(scope="module")
def graph_steps(pair) -> dict:  # type: ignore[type-arg]
    return {key: steady_step(*pair, batch=key[0], k=key[1], temperature=key[2], graphs=True) for key in GRAPH_BUDGET}


def test_the_counter_sees_ops_and_host_reads() -> None:
    import torch

    with counting() as c:
        x = torch.ones(4) + 1
        x.tolist()
        bool(x.sum() > 0)
    # ones, add, sum, gt and bool's device-to-host copy (_local_scalar_dense); tolist and bool
    assert c.ops == 5 and c.host_reads == 2
    assert set(c.by_op) == {"ones", "add", "sum", "gt", "_local_scalar_dense"}


@pytest.mark.parametrize("k", [0, 4])
def test_launches_per_step_do_not_grow_with_the_batch(steps, k: int) -> None:
    alone, crowd = steps[(1, k, 0.0)], steps[(16, k, 0.0)]
    assert crowd.ops <= 1.15 * alone.ops, f"B=16: {crowd.ops} ops vs B=1: {alone.ops}: {crowd.by_op.most_common(6)}"
    for b in (1, 16):
        ops = steps[(b, k, 0.0)].ops
        assert ops <= OPS_BUDGET[(b, k)], f"{ops} kernel ops > budget {OPS_BUDGET[(b, k)]}"


def test_attention_is_one_call_per_layer_per_forward(steps) -> None:
    # k=0: the target forward only; k=4: the target and four draft positions
    assert steps[(16, 0, 0.0)].by_op["scaled_dot_product_attention"] == TARGET_LAYERS
    assert steps[(16, 4, 0.0)].by_op["scaled_dot_product_attention"] == TARGET_LAYERS + 4 * DRAFT_LAYERS


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_speculative_step_makes_at_most_four_host_round_trips(steps, temperature: float) -> None:
    counts = steps[(16, 4, temperature)]
    assert counts.host_reads <= MAX_ROUND_TRIPS, f"{counts.host_reads} host round trips"


def test_plain_decoding_reads_the_host_as_often_alone_as_in_a_crowd(steps) -> None:
    assert steps[(1, 0, 0.0)].host_reads == steps[(16, 0, 0.0)].host_reads


def test_with_decode_graphs_a_step_launches_a_few_dozen_kernels_per_forward(graph_steps) -> None:
    """Five forwards at k=4 (four draft positions, one verification), each one replay."""
    for key, budget in GRAPH_BUDGET.items():
        counts = graph_steps[key]
        assert counts.ops <= budget, f"{key}: {counts.ops} launches: {counts.by_op.most_common(6)}"
        assert counts.by_op["cuda_graph_replay"] == (5 if key[1] else 1)
        assert counts.host_reads <= MAX_ROUND_TRIPS
