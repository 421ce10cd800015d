"""The speculation-ceiling replay (``clients/tools/speculation_ceiling.py``): its oracle's arithmetic on
a workload whose answer is known in closed form, and the engine policy's replay bounded by it."""

from __future__ import annotations

import pytest

from clients.tools import speculation_ceiling as ceiling
from specdec_core.speculation.cost_table import CostTable
from specdec_core.speculation.step_costs import StepCostModel

# One row costs 1 s, five 2 s; no context term, so every pass's price is its rows alone.
COSTS = StepCostModel(CostTable([1, 5], [1.0, 2.0]), None)


def copy_task() -> list[tuple[list[int], list[int]]]:
    """A request whose answer repeats its prompt: after the first token every lookup is right."""
    text = list(range(10, 60))
    return [(text, list(text))]


@pytest.mark.parametrize("method", ["ngram", "auto"])  # suffix proposes no more than its match's length at first
def test_the_oracle_verifies_every_right_draft_and_its_price_is_exact(method):
    r = ceiling.replay(copy_task(), method, COSTS, cap=4, oracle=True)
    # Pass 1: the prompt's last token has no earlier occurrence, so one row. Then 9 passes of 4
    # drafts + 1 (2 s each, 45 tokens) and a last pass of the 3 drafts the answer has left
    # (4 rows: 1.75 s by the table's line).
    assert (r.tokens, r.passes, r.drafted, r.accepted) == (50, 11, 39, 39)
    assert r.seconds == pytest.approx(1.0 + 9 * 2.0 + 1.75)
    assert r.off_seconds == pytest.approx(50.0)


@pytest.mark.parametrize("trees", [False, True])
@pytest.mark.parametrize("method", ["ngram", "suffix", "auto"])
def test_the_engine_policy_replays_at_or_below_the_oracle(method, trees):
    policy = ceiling.replay(copy_task(), method, COSTS, cap=4, oracle=False, trees=trees)
    oracle = ceiling.replay(copy_task(), method, COSTS, cap=4, oracle=True)
    assert policy.tokens == oracle.tokens == 50
    assert 1.0 < policy.speedup <= oracle.speedup


def test_text_that_never_repeats_gets_no_drafts_and_no_speed_up():
    requests = [(list(range(100, 140)), list(range(200, 230))), (list(range(300, 340)), list(range(400, 430)))]
    for oracle in (False, True):
        r = ceiling.replay(requests, "auto", COSTS, cap=4, oracle=oracle)
        assert (r.drafted, r.passes) == (0, 60) and r.speedup == 1.0


def test_the_row_cost_scales_only_what_rows_past_the_first_add():
    full, quarter = ceiling.cost_table(None, 1.0), ceiling.cost_table(None, 0.25)
    assert quarter.target(1, frozen=True) == full.target(1, frozen=True)
    assert quarter.target(5, frozen=True) - quarter.target(1, frozen=True) == pytest.approx(
        0.25 * (full.target(5, frozen=True) - full.target(1, frozen=True)))



def test_a_tree_keeps_its_deepest_path_that_the_answer_follows():
    # 5 -> (6 -> 7, 8 -> 9): the answer goes 5, 8, 9, 4
    tree = ceiling.DraftTree([5, 6, 7, 8, 9], [-1, 0, 1, 0, 3])
    assert ceiling.kept_path(tree, [5, 8, 9, 4]) == 3
    assert ceiling.kept_path(tree, [5, 6, 2]) == 2
    assert ceiling.kept_path(tree, [4]) == 0
    assert ceiling.kept_path(tree, [5, 8]) == 2  # the answer ends: nothing deeper was decided
    assert ceiling.kept_path(ceiling.DraftTree.chain([1, 2, 3]), [1, 2, 4]) == 2  # a chain: its kept prefix
