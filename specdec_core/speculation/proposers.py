"""What the proposers hand the verifier: every request's drafts and the distributions they came from.

Two proposers: a draft model (``draft_model``: batched, one forward per draft position for all
requests at once; q is what each draft was sampled from) and n-gram prompt lookup (``ngram``: no
model; q is one-hot on the looked-up tokens). The speculation policy picks one per request per
step; ``propose`` merges both kinds into one ``Proposal``.
"""

from __future__ import annotations

import torch

from specdec_core.engine.step_plan import ScheduledRequest
from specdec_core.speculation.draft_model import DraftModelProposer
from specdec_core.speculation.ngram import NgramProposer
from specdec_core.speculation.proposal import Proposal


def propose(items: list[ScheduledRequest], draft: DraftModelProposer | None, ngram: NgramProposer | None) -> Proposal:
    """Looked-up tokens where the policy chose n-gram; the draft model for the rest (and for
    mirroring prompt chunks into its cache)."""
    proposal = draft.propose(items) if draft is not None and draft.wanted(items) else None
    tokens = proposal.tokens if proposal else [[] for _ in items]
    looked_up = ngram.propose(items) if ngram is not None else {}
    for b, found in looked_up.items():
        tokens[b] = found
    probs = proposal.probs if proposal else None
    if looked_up and probs is not None:
        k_max = max(len(t) for t in tokens)
        if probs.shape[1] < k_max:
            probs = torch.cat([probs, probs.new_zeros(len(items), k_max - probs.shape[1], probs.shape[2])], dim=1)
        for b in looked_up:
            probs[b, :len(tokens[b])] = 0.0
            probs[b, torch.arange(len(tokens[b])), torch.tensor(tokens[b], dtype=torch.long)] = 1.0
    return Proposal(tokens, probs, proposal.draft_cached if proposal else None)
