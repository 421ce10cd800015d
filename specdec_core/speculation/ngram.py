"""N-gram prompt lookup: drafts copied from where the request's own text repeated its last tokens.

No model runs, so a lookup costs only verification rows; its q is one-hot on the looked-up tokens.
"""

from __future__ import annotations

from specdec_core.speculation.draft_tree import DraftTree
from specdec_core.speculation.ngram_index import NgramIndex
from specdec_core.speculation.scheduled_request import SpeculatingRequest


class NgramProposer:
    """Proposes each request's lookup from its own ``NgramIndex`` (the request owns the index,
    built with it, so it is retired with it)."""

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n, self.max_n = min_n, max_n

    def new_index(self) -> NgramIndex:
        return NgramIndex(self.min_n, self.max_n)

    @staticmethod
    def lookup(req: SpeculatingRequest, k: int) -> list[int]:
        """Up to ``k`` looked-up tokens, cut where the request's grammar (if any) would reject
        them: a draft the target can never accept only costs verification rows. The same text
        and ``k`` give the same tokens, so the policy may ask for the cap and the proposal for
        the chosen k."""
        tokens = req.ngram.lookup(req.all_ids, k) if req.ngram else []
        if tokens and req.grammar is not None:
            tokens = tokens[: req.grammar.valid_prefix(tokens)]
        return tokens

    def lookup_tree(self, req: SpeculatingRequest, k: int) -> DraftTree:
        """The lookup as a chain: a request's own text offers one continuation per match."""
        return DraftTree.chain(self.lookup(req, k))
