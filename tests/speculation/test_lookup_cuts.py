"""One lookup a step: the policy looks each request up once, at its cap, and the step verifies
that lookup cut to the chosen k (``Lookup.cut``). That is lossless and reproducible only if the
cut is exactly the lookup at k, which is what the step used to make: checked here against the
definition, for the tries' proposals (``Proposal.first``) and for the proposers' lookups, on
random text where the winning trie changes with k (so a plain prefix of the cap's tree is not
enough, and the test would see it)."""

from __future__ import annotations

import random

from specdec_core.decoding.sampling_params import SamplingParams
from specdec_core.engine.request import Request
from specdec_core.speculation.ngram import NgramProposer
from specdec_core.speculation.ngram_index import NgramIndex
from specdec_core.speculation.suffix import MIN_TOKEN_PROB, SuffixProposer
from specdec_core.speculation.suffix_trie import SuffixIndex
from tests.helpers.random_tries import random_trie


def test_a_proposal_cut_to_k_is_the_proposal_at_k():
    """Chain and tree, every k up to the cap: the same tokens, parents, ratios and score (to the
    bit: the policy compares tries by it)."""
    rng = random.Random(11)
    cuts = 0
    for _ in range(300):
        trie, context = random_trie(rng)
        cap = rng.randint(1, 10)
        for propose in (trie.propose, trie.propose_tree):
            whole = propose(context, cap, 4, MIN_TOKEN_PROB, 2.0)
            for k in range(cap + 1):
                assert whole.first(k) == propose(context, k, 4, MIN_TOKEN_PROB, 2.0), (k, whole)
                cuts += k < len(whole.tokens)
    assert cuts > 500  # most cases really cut


def _request(text: list[int], seeded: bool = False, logprobs: bool = False) -> Request:
    """A request over ``text``; seeded: it reads its own trie only; logprobs: it takes no tree."""
    params = SamplingParams(max_tokens=50, temperature=0.8 if seeded else 0.0, seed=5 if seeded else None,
                            logprobs=1 if logprobs else None)
    return Request("r", text, params, random.Random(0), None, 8,  # type: ignore[arg-type]
                   ngram=NgramIndex(1, 4), suffix=SuffixIndex(8))


def test_a_lookup_cut_to_k_is_the_lookup_at_k():
    """For every proposer, tree or chain, seeded (own trie only) or not: ``propose(req, cap)
    .cut(k) == lookup_tree(req, k)``. On this text the winning trie changes with k in some
    cases, where the cap's tree cut to k differs from the lookup at k."""
    rng = random.Random(3)
    switched = 0
    for case in range(200):
        suffix = SuffixProposer(depth=8, cache_tokens=400, trees=case % 2 == 0)
        for _ in range(rng.randint(0, 5)):
            done = _request([0])
            done.output_ids = [rng.randrange(5) for _ in range(rng.randint(2, 40))]
            suffix.retire(done)
        text = [rng.randrange(5) for _ in range(rng.randint(2, 40))]
        req = _request(text, seeded=case % 3 == 0, logprobs=case % 5 == 0)
        for proposer in (suffix, NgramProposer(1, 4)):
            for cap in range(1, 9):
                found = proposer.propose(req, cap)
                assert found.tree == proposer.lookup_tree(req, cap)
                for k in range(cap + 1):
                    at_k = proposer.lookup_tree(req, k)
                    assert found.cut(k) == at_k, (case, cap, k)
                    switched += at_k != found.tree.first(k)
    assert switched > 0
