"""Lookups priced by their evidence: the calibration's counts, and the policy acting on them."""

from __future__ import annotations

import pytest
import torch

from specdec_core import SamplingParams
from specdec_core.engine.request import Request
from specdec_core.speculation.acceptance import expected_tokens
from specdec_core.speculation.cost_table import CostTable
from specdec_core.speculation.draft_tree import DraftTree, TokenEvidence
from specdec_core.speculation.lookup_calibration import MEMORY, PRIOR_WEIGHT, LookupCalibration
from specdec_core.speculation.ngram import NgramProposer
from specdec_core.speculation.ngram_index import NgramIndex
from specdec_core.speculation.policy import SpeculationPolicy
from specdec_core.speculation.scheduled_request import ScheduledRequest
from specdec_core.speculation.step_costs import StepCostModel

# One request's verify pass on the 2-core Zen 4, default pair's target (ms by rows).
COSTS = StepCostModel(CostTable([1, 2, 3, 5, 9], [29.2, 32.2, 38.2, 46.9, 75.9]), None)


def evidence(*keys_and_priors: tuple[str, float]) -> tuple[TokenEvidence, ...]:
    return tuple(TokenEvidence(k, p) for k, p in keys_and_priors)


def test_a_fresh_calibration_prices_each_node_at_its_prior_along_its_path():
    calibration = LookupCalibration()
    chain = DraftTree.chain([7, 8, 9], evidence(("a", 0.9), ("b", 0.5), ("c", 0.5)))
    assert calibration.expected(chain) == pytest.approx([1, 1.9, 2.35, 2.575])
    # a tree: 8 and 6 both follow 7; the likelier path first, whatever its place in preorder
    tree = DraftTree([7, 8, 6], [-1, 0, 0], evidence(("a", 0.9), ("b", 0.3), ("c", 0.6)))
    assert calibration.expected(tree) == pytest.approx([1, 1.9, 1.9 + 0.54, 1.9 + 0.54 + 0.27])


def test_scoring_counts_each_decided_node_as_reached_and_kept_or_not():
    calibration = LookupCalibration()
    # 7 -> (8 -> 9, 6): the target commits 7, 8, 5
    tree = DraftTree([7, 8, 9, 6], [-1, 0, 1, 0], evidence(("a", .5), ("b", .5), ("c", .5), ("d", .5)))
    calibration.score(tree, [7, 8, 5])
    assert [calibration.counts(k) for k in "abcd"] == [(1, 1), (1, 1), (0, 1), (0, 1)]
    # the target commits 4 (no draft kept): only the first node decided
    calibration.score(tree, [4])
    assert [calibration.counts(k) for k in "abcd"] == [(1, 2), (1, 1), (0, 1), (0, 1)]
    # a proposal longer than what was committed: the nodes past it were never decided
    calibration.score(DraftTree.chain([7, 8, 9], evidence(("e", .5), ("f", .5), ("g", .5))), [7, 8])
    assert [calibration.counts(k) for k in "efg"] == [(1, 1), (1, 1), (0, 0)]
    assert calibration.scored == 7


def test_counts_overrule_the_prior_and_age():
    calibration = LookupCalibration()
    node = DraftTree.chain([5], evidence(("x", 0.9)))
    for _ in range(30):
        calibration.score(node, [4])  # never kept
    assert calibration.chance(node.evidence[0]) == pytest.approx(0.9 * PRIOR_WEIGHT / (30 + PRIOR_WEIGHT))
    for _ in range(int(MEMORY)):
        calibration.score(node, [5])  # then always: the old misses halve away
    kept, reached = calibration.counts("x")
    assert reached <= MEMORY and kept / reached > 0.9


def ngram_request(ids: list[int], *, seed: int | None = None) -> Request:
    """A greedy decoding request whose text is ``ids`` (its prompt), with its n-gram index."""
    params = SamplingParams(max_tokens=100, temperature=0.0 if seed is None else 1.0, seed=seed)
    req = Request("r", list(ids), params, torch.Generator().manual_seed(0), None, 4,  # type: ignore[arg-type]
                  ngram=NgramIndex(1, 4))
    req.num_computed = len(ids) - 1
    return req


LONG_MATCH = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 11, 12, 13, 14]  # its last 4 tokens occurred
SHORT_MATCH = [21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 40, 41, 24]  # only its last token did


def test_the_policy_drafts_what_the_evidence_says_is_kept_where_one_estimate_would_not_tell():
    """Two requests, the same history of acceptance (none: the prior), lookups matched on 4 tokens
    and on 1. Once the calibration has seen 4-token matches kept and 1-token matches rejected,
    the 4-token lookup is verified in full and the 1-token one not at all; priced by the request's
    own estimate, both got the same k."""
    lookups = {"ngram": NgramProposer(1, 4)}

    def planned(policy: SpeculationPolicy, ids: list[int], seed: int | None = None) -> int:
        item = ScheduledRequest(ngram_request(ids, seed=seed), 1)
        policy.plan([item])
        return item.num_drafts

    policy = SpeculationPolicy("ngram", COSTS, True, 4096, lookups)  # type: ignore[arg-type]
    long_tree, short_tree = (NgramProposer.lookup_tree(ngram_request(ids), 4) for ids in (LONG_MATCH, SHORT_MATCH))
    assert long_tree.evidence[0].key != short_tree.evidence[0].key  # the match length is in the key
    untaught = planned(policy, LONG_MATCH), planned(policy, SHORT_MATCH)
    for _ in range(200):
        policy.calibration.score(long_tree, long_tree.tokens + [1])  # all kept
        policy.calibration.score(short_tree, [99])  # none kept
    assert untaught[0] == untaught[1] > 0
    assert planned(policy, LONG_MATCH) == 4 > untaught[0] and planned(policy, SHORT_MATCH) == 0
    # a seeded request's k is its own history's: what the others taught does not move it
    fresh = SpeculationPolicy("ngram", COSTS, True, 4096, lookups)  # type: ignore[arg-type]
    assert planned(policy, SHORT_MATCH, seed=1) == planned(fresh, SHORT_MATCH, seed=1)


def test_the_geometric_price_is_kept_where_a_lookup_gives_no_evidence():
    policy = SpeculationPolicy("ngram", COSTS, True, 4096, {})
    req = ngram_request(LONG_MATCH)
    assert policy._lookup_expected(req, "ngram", DraftTree.chain([5, 6])) == pytest.approx(
        [expected_tokens(req.alpha("ngram"), k) for k in range(3)])
