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

from specdec_core.speculation.draft_tree import DraftTree
from specdec_core.speculation.scheduled_request import SpeculatingRequest
from specdec_core.speculation.suffix_trie import Proposal, SuffixCache, SuffixIndex, SuffixTrie

MIN_TOKEN_PROB = 0.1  # stop a proposal at a token that followed its context less often than this
SPEC_FACTOR = 1.0  # propose at most this many tokens per token of match (vLLM's max_spec_factor)


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

    def proposal(self, req: SpeculatingRequest, k: int) -> Proposal:
        """The better-scoring of the request's own and (unless seeded) the global proposal for at
        most ``k`` tokens; the own one on a tie."""
        if req.suffix is None or k <= 0:
            return Proposal.none()
        req.suffix.catch_up(req.all_ids)
        context = req.all_ids[-self.max_match:]
        best = req.suffix.trie.propose(context, k, self.max_match, MIN_TOKEN_PROB, SPEC_FACTOR)
        if not req.seeded and len(self.cache):
            other = self.cache.trie.propose(context, k, self.max_match, MIN_TOKEN_PROB, SPEC_FACTOR)
            if other.score > best.score:
                best = other
        return best

    def lookup(self, req: SpeculatingRequest, k: int) -> list[int]:
        """Up to ``k`` proposed tokens, cut where the request's grammar (if any) would reject them
        (as ``NgramProposer.lookup``). A request's own-trie tokens for k are the first k of those
        for a larger k; which trie wins may change with k, which changes speed only."""
        tokens = self.proposal(req, k).tokens
        if tokens and req.grammar is not None:
            tokens = tokens[: req.grammar.valid_prefix(tokens)]
        return tokens

    def lookup_tree(self, req: SpeculatingRequest, k: int) -> DraftTree:
        """Up to ``k`` drafts as a tree of the likeliest continuations (``SuffixTrie.propose_tree``)
        where trees are on and the request takes one (``Request.takes_tree``), else ``lookup``'s
        chain. Own trie against global as in ``proposal``, by the trees' scores."""
        if not self.trees or not req.takes_tree or req.suffix is None or k <= 0:
            return DraftTree.chain(self.lookup(req, k))
        req.suffix.catch_up(req.all_ids)
        context = req.all_ids[-self.max_match:]
        tries: list[SuffixTrie] = [req.suffix.trie] + ([self.cache.trie] if not req.seeded and len(self.cache) else [])
        best, best_score = DraftTree([]), 0.0
        for trie in tries:
            tree, _, score = trie.propose_tree(context, k, self.max_match, MIN_TOKEN_PROB, SPEC_FACTOR)
            if score > best_score:
                best, best_score = tree, score
        return best

    def retire(self, req: SpeculatingRequest) -> None:
        """A finished request's output joins the global trie (the oldest outputs leave it when the
        budget is full). A request that turned speculation off (``speculative: false``, k = 0)
        neither reads nor feeds it: its text never steers another request's proposals, and a
        benchmark's 'off' arm cannot hand the 'on' arm the very output it is about to write."""
        if req.output_ids and req.max_spec_tokens > 0:
            self.cache.add(req.output_ids)
