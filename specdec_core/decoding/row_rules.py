"""How a request's logits rows are warped and masked, one rule for the draft model's q and the
target's p: penalties over the committed tokens, the ``min_tokens`` ban, the grammar's mask after
the drafts before a row. One rule for both is what keeps speculation lossless under all three.

``RowRules`` is a part of the engine's ``Request`` (its base class): the rules read the
request's parameters, committed tokens, grammar state and ban, and write nothing. It lives in
decoding, beside the warping it feeds, so the rules of a row are read in one place.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from specdec_core.decoding.sampling import RowParams

if TYPE_CHECKING:  # types only: the rules read these, never call into their modules' imports
    from specdec_core.decoding.grammar import GrammarState
    from specdec_core.decoding.sampling_params import SamplingParams


class RowRules:
    """The row rules of one request (a base of ``engine.request.Request``, which sets the
    attributes below)."""

    params: SamplingParams
    output_ids: list[int]
    # Structured output: the grammar state at the committed tokens (None: unconstrained).
    grammar: GrammarState | None
    # Token ids masked until ``params.min_tokens`` tokens are out (EOS unless ignored, stop ids).
    min_tokens_ban: list[int]

    def row_params(self, num_drafts: int) -> RowParams:
        """How the logits row after the committed tokens plus ``num_drafts`` drafts is warped.
        The draft model's q and the target's p both come from here: one rule for both is what
        keeps speculation lossless under penalties, ``min_tokens`` and grammars alike.

        Penalties count the committed tokens here; the drafts before the row are counted on the
        device, where they are drawn (``WarpTable.draft_history``). A grammar's mask depends on
        the drafts themselves: ``grammar_mask`` gives it (the ``min_tokens`` ban folded in)."""
        p = self.params
        history = self.output_ids if p.has_penalties else None
        banned = self.min_tokens_ban if len(self.output_ids) + num_drafts < p.min_tokens and self.grammar is None else []
        return RowParams(p, history, banned)

    def row_mask(self, drafts: list[int], alive: bool) -> torch.Tensor | None:
        """The grammar mask of the row after ``drafts`` (None without a grammar). ``alive``
        False: some draft before it was drawn from an empty q (the grammar left the draft head
        nothing); verification rejects that draft, so this row is never used and must not be
        asked of the grammar (the drafts after it are arbitrary): nothing is allowed."""
        if self.grammar is None:
            return None
        if not alive:
            return torch.zeros(self.grammar.vocab_size, dtype=torch.bool)
        return self.grammar_mask(drafts)

    def grammar_mask(self, drafts: list[int]) -> torch.Tensor:
        """Bool ``[V]``: what the grammar allows after the committed tokens plus ``drafts``,
        less the ``min_tokens`` ban unless the grammar allows only the end there (it wins)."""
        assert self.grammar is not None
        allowed = self.grammar.mask(drafts)
        if len(self.output_ids) + len(drafts) < self.params.min_tokens and self.min_tokens_ban:
            rest = allowed.clone()
            rest[self.min_tokens_ban] = False
            if rest.any():
                allowed = rest
        return allowed

    @property
    def takes_tree(self) -> bool:
        """Whether its drafts may be a token tree (``draft_tree``): not with a grammar (its masks
        follow one chain of drafts) or log-probabilities (read from the chain's rows)."""
        return self.grammar is None and self.params.logprobs is None
