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
from typing import TYPE_CHECKING

from specdec_core.speculation.draft_tree import DraftTree, Lookup, TokenEvidence
from specdec_core.speculation.scheduled_request import SpeculatingRequest
from specdec_core.speculation.suffix_trie import Proposal, SuffixCache, SuffixIndex, SuffixTrie

if TYPE_CHECKING:  # a type only: the lookup calls the request's grammar state, never imports it
    from specdec_core.decoding.grammar import GrammarState

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
        return self._lookup(req, k, trees=False).tree.tokens

    def lookup_tree(self, req: SpeculatingRequest, k: int) -> DraftTree:
        """Up to ``k`` drafts (``propose``'s at ``k``)."""
        return self.propose(req, k).tree

    def propose(self, req: SpeculatingRequest, cap: int) -> SuffixLookup:
        """The policy's one lookup a step: each trie's proposal for up to ``cap`` drafts, kept so
        that the drafts for any smaller k follow without walking the tries again
        (``SuffixLookup.cut``). A token tree of the likeliest continuations
        (``SuffixTrie.propose_tree``) where trees are on and the request takes one
        (``Request.takes_tree``), else a chain (``SuffixTrie.propose``), cut where the request's
        grammar (if any) would reject it (as ``NgramProposer.lookup_tree``)."""
        return self._lookup(req, cap, self.trees and req.takes_tree)

    def _lookup(self, req: SpeculatingRequest, cap: int, trees: bool) -> SuffixLookup:
        if req.suffix is None or cap <= 0:
            return SuffixLookup([], False, None)
        context = req.all_ids[-self.max_match:]
        found = [(name, trie.propose_tree(context, cap, self.max_match, MIN_TOKEN_PROB, SPEC_FACTOR) if trees
                  else trie.propose(context, cap, self.max_match, MIN_TOKEN_PROB, SPEC_FACTOR))
                 for name, trie in self._tries(req)]
        return SuffixLookup(found, trees, None if trees else req.grammar)

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


class SuffixLookup(Lookup):
    """A suffix lookup at a cap: every trie's proposal (``found``, the request's own first).
    A lookup at a smaller k has each trie's proposal cut to k (``Proposal.first``), but which
    trie wins is decided on the cut proposals' scores, so it may change with k; ``cut`` decides
    it again, as a lookup at k would, and is that lookup exactly. A tree goes to the trie that
    scores higher (the own one on a tie; none without a positive score); a chain to the own
    trie unless the global one scores higher, then is cut where ``grammar`` rejects it."""

    def __init__(self, found: list[tuple[str, Proposal]], trees: bool, grammar: GrammarState | None) -> None:
        self.found, self.trees, self.grammar = found, trees, grammar
        self._valid: dict[str, int] = {}  # trie -> how many of its proposal's tokens the grammar accepts
        super().__init__(self._at(None))

    def cut(self, k: int) -> DraftTree:
        return self.tree if k >= max((len(p.tokens) for _, p in self.found), default=0) else self._at(max(k, 0))

    def _at(self, k: int | None) -> DraftTree:
        """The drafts of a lookup at ``k`` (None: at the cap)."""
        best, best_trie = Proposal.none(), "own"
        for name, found in self.found:
            proposal = found if k is None else found.first(k)
            if (not self.trees and name == "own") or proposal.score > best.score:
                best, best_trie = proposal, name
        tree = _draft_tree(best, best_trie)
        if tree.tokens and self.grammar is not None:
            # The grammar accepts tokens one after another: of a proposal's first k it accepts
            # what it accepts of the whole proposal, or k.
            if best_trie not in self._valid:
                whole = next(p for name, p in self.found if name == best_trie)
                self._valid[best_trie] = self.grammar.valid_prefix(whole.tokens)
            tree = tree.first(min(self._valid[best_trie], len(tree)))
        return tree


def _draft_tree(proposal: Proposal, trie: str) -> DraftTree:
    """The proposal as a draft tree, each node with its evidence (keys above; prior: its count
    ratio)."""
    tree = DraftTree(proposal.tokens, list(proposal.parents))
    match = min(proposal.match_len, LONGEST_MATCH) // MATCH_STEP
    evidence = tuple(TokenEvidence(("suffix", trie, match, bisect.bisect_right(RATIO_BANDS, ratio),
                                    min(counted, MOST_COUNTED), min(depth - 1, DEEPEST)), ratio)
                     for (ratio, counted), depth in zip(proposal.ratios, tree.depths, strict=True))
    return DraftTree(tree.tokens, tree.parents, evidence)
