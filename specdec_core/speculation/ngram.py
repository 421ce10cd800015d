"""N-gram prompt lookup: drafts copied from where the request's own text repeated its last tokens.

No model runs, so a lookup costs only verification rows; its q is one-hot on the looked-up tokens.
Each drafted token carries its evidence (``TokenEvidence``): the matched n-gram's length and the
token's place in the draft, which ``lookup_calibration`` prices (a 4-token match is kept about
three times as often as a 1-token one).
"""

from __future__ import annotations

from specdec_core.speculation.acceptance import PRIOR
from specdec_core.speculation.draft_tree import DraftTree, Lookup, TokenEvidence
from specdec_core.speculation.ngram_index import NgramIndex
from specdec_core.speculation.scheduled_request import SpeculatingRequest

DEEPEST = 4  # drafts from the fifth on share one evidence key


class NgramProposer:
    """Proposes each request's lookup from its own ``NgramIndex`` (the request owns the index,
    built with it, so it is retired with it)."""

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n, self.max_n = min_n, max_n

    def new_index(self) -> NgramIndex:
        return NgramIndex(self.min_n, self.max_n)

    @staticmethod
    def lookup(req: SpeculatingRequest, k: int) -> list[int]:
        """Up to ``k`` looked-up tokens (``lookup_tree``'s)."""
        return NgramProposer.lookup_tree(req, k).tokens

    @staticmethod
    def propose(req: SpeculatingRequest, cap: int) -> Lookup:
        """The policy's one lookup a step: ``lookup_tree`` at ``cap``, whose first k tokens are
        the lookup at any smaller k (the match does not depend on k, nor the evidence of a
        token on the tokens after it, and the grammar's cut of the first k tokens is its cut of
        them all, or k), so the step verifies a cut of it (``Lookup.cut``)."""
        return Lookup(NgramProposer.lookup_tree(req, cap))

    @staticmethod
    def lookup_tree(req: SpeculatingRequest, k: int) -> DraftTree:
        """The lookup as a chain (a request's own text offers one continuation per match), cut
        where the request's grammar (if any) would reject it: a draft the target can never
        accept only costs verification rows."""
        tokens, n = req.ngram.match(req.all_ids, k) if req.ngram else ([], 0)
        if tokens and req.grammar is not None:
            tokens = tokens[: req.grammar.valid_prefix(tokens)]
        return DraftTree.chain(tokens, tuple(TokenEvidence(("ngram", n, min(j, DEEPEST)), PRIOR["ngram"])
                                             for j in range(len(tokens))))
