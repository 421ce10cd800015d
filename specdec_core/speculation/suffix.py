"""Suffix decoding: drafts from the most frequent continuation of the longest match of a request's
last tokens, in its own text and in the outputs of recently finished requests.

Where traffic repeats itself across requests (agents re-sending and re-editing the same files,
tool calls in the same JSON shapes), a request's next tokens have often been written before by
another request. Like the n-gram lookup this costs no model forward and its q is one-hot, so it is
verified by the same path and exactly as losslessly: a proposal only decides what the target
checks, never what it emits.

Two tries (``suffix_trie``): the request's own (prompt and output, owned by the request and
retired with it) and the global ``SuffixCache`` (this proposer's, fed by ``retire``). A lookup
proposes from whichever scores higher (expected accepted tokens by the counts).

Reproducibility: a seeded sampled request draws one uniform per draft, so its drafts may depend
only on its own text (as its k does, see ``policy.solo_k``): it never looks in the global trie.
For every other request, *when* proposals come depends on what other requests wrote, which
changes speed only.
"""

from __future__ import annotations

import bisect

from specdec_core.speculation.draft_tree import DraftTree, TokenEvidence
from specdec_core.speculation.scheduled_request import SpeculatingRequest
from specdec_core.speculation.suffix_trie import Proposal, SuffixCache, SuffixIndex, SuffixTrie

MIN_TOKEN_PROB = 0.1  # stop a proposal at a token that followed its context less often than this
SPEC_FACTOR = 1.0  # propose at most this many tokens per token of match (vLLM's max_spec_factor)
# How a token's evidence is keyed (``lookup_calibration``): its trie, its match's length in steps
# of 3 (12 and more together), its count ratio's band, the count it was taken of (4 and more
# together) and its depth (3 and more together). Replayed, the match's length, the ratio and the
# count each moved the chance of a token being kept by tens of points
# (docs/speculation-measurements.md, "Lookups priced by their evidence").
MATCH_STEP, LONGEST_MATCH = 3, 12
RATIO_BANDS = (0.3, 0.5, 0.7, 0.9)
MOST_COUNTED, DEEPEST = 4, 2


class SuffixProposer:
    """Proposes each request's continuation from its own ``SuffixIndex`` and the global cache."""

    def __init__(self, depth: int, cache_tokens: int, trees: bool = False) -> None:
        """``depth``: the tries' depth; a match uses at most half of it, so a proposal can run
        at least the other half. ``cache_tokens``: the global trie's token budget. ``trees``:
        propose token trees (``lookup_tree``) to requests that take them."""
        self.depth = depth
        self.max_match = depth // 2
        self.cache = SuffixCache(depth, cache_tokens)
        self.trees = trees

    def new_index(self) -> SuffixIndex:
        return SuffixIndex(self.depth)

    def lookup(self, req: SpeculatingRequest, k: int) -> list[int]:
        """Up to ``k`` proposed tokens as a chain (``lookup_tree`` without trees)."""
        return self._chain(req, k).tokens

    def lookup_tree(self, req: SpeculatingRequest, k: int) -> DraftTree:
        """Up to ``k`` drafts as a tree of the likeliest continuations (``SuffixTrie.propose_tree``)
        where trees are on and the request takes one (``Request.takes_tree``), else a chain.
        Of the request's own trie and (unless seeded) the global one, the proposal that scores
        higher (expected accepted tokens by the counts); the own one on a tie."""
        if not self.trees or not req.takes_tree or req.suffix is None or k <= 0:
            return self._chain(req, k)
        context = req.all_ids[-self.max_match:]
        best, best_trie = Proposal.none(), "own"
        for name, trie in self._tries(req):
            proposal = trie.propose_tree(context, k, self.max_match, MIN_TOKEN_PROB, SPEC_FACTOR)
            if proposal.score > best.score:
                best, best_trie = proposal, name
        return _draft_tree(best, best_trie)

    def _chain(self, req: SpeculatingRequest, k: int) -> DraftTree:
        """The better-scoring chain of the tries (as ``lookup_tree``), cut where the request's
        grammar (if any) would reject it (as ``NgramProposer.lookup_tree``). A request's
        own-trie tokens for k are the first k of those for a larger k; which trie wins may
        change with k, which changes speed only."""
        if req.suffix is None or k <= 0:
            return DraftTree([])
        context = req.all_ids[-self.max_match:]
        best, best_trie = Proposal.none(), "own"
        for name, trie in self._tries(req):
            proposal = trie.propose(context, k, self.max_match, MIN_TOKEN_PROB, SPEC_FACTOR)
            if name == "own" or proposal.score > best.score:
                best, best_trie = proposal, name
        tree = _draft_tree(best, best_trie)
        if tree.tokens and req.grammar is not None:
            tree = tree.first(req.grammar.valid_prefix(tree.tokens))
        return tree

    def _tries(self, req: SpeculatingRequest) -> list[tuple[str, SuffixTrie]]:
        """The tries a lookup for ``req`` reads, caught up with its text: its own, then the
        global one unless the request is seeded or the cache empty."""
        assert req.suffix is not None
        req.suffix.catch_up(req.all_ids)
        own: list[tuple[str, SuffixTrie]] = [("own", req.suffix.trie)]
        return own + ([("global", self.cache.trie)] if not req.seeded and len(self.cache) else [])

    def retire(self, req: SpeculatingRequest) -> None:
        """A finished request's output joins the global trie (the oldest outputs leave it when the
        budget is full). A request that turned speculation off (``speculative: false``, k = 0)
        neither reads nor feeds it: its text never steers another request's proposals, and a
        benchmark's 'off' arm cannot hand the 'on' arm the very output it is about to write."""
        if req.output_ids and req.max_spec_tokens > 0:
            self.cache.add(req.output_ids)


def _draft_tree(proposal: Proposal, trie: str) -> DraftTree:
    """The proposal as a draft tree, each node with its evidence (keys above; prior: its count
    ratio)."""
    tree = DraftTree(proposal.tokens, list(proposal.parents))
    match = min(proposal.match_len, LONGEST_MATCH) // MATCH_STEP
    evidence = tuple(TokenEvidence(("suffix", trie, match, bisect.bisect_right(RATIO_BANDS, ratio),
                                    min(counted, MOST_COUNTED), min(depth - 1, DEEPEST)), ratio)
                     for (ratio, counted), depth in zip(proposal.ratios, tree.depths, strict=True))
    return DraftTree(tree.tokens, tree.parents, evidence)
