"""What the policy, the requests and the metrics share about acceptance: the proposer names, the
per-request acceptance estimate, what a request learns of each proposer (``AcceptanceLearning``, a
base of the engine's ``Request``) and the expected tokens of one verify pass. Acceptance learning
lives here, in speculation, beside the policy that acts on it; the module imports nothing of the
project but a type, so the policy and the engine's request both read it without importing each other."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from specdec_core.speculation.draft_tree import DraftTree

Source = Literal["draft", "ngram", "suffix"]
LOOKUP_SOURCES: tuple[Source, ...] = ("ngram", "suffix")  # proposers that run no model: one-hot q
ACCEPTANCE_DECAY = 0.8  # weight of a request's older evidence in its acceptance estimate
MAX_ALPHA = 0.98
# Acceptance assumed before a request has any history: optimistic enough that a lone request
# tries the draft model at once (break-even on the 2-core CPU is about 0.7) and learns its own
# alpha in a few steps, rather than waiting for a probe.
PRIOR: dict[Source, float] = {"draft": 0.75, "ngram": 0.5, "suffix": 0.5}
# How many standard errors below its mean the policy takes a lookup's estimate (a Wilson lower
# bound; ``AcceptanceLearning.alpha`` says why lookups only).
# The policy drafts where an estimate clears the break-even, and a mean from a handful of
# passes clears it most often where it is too high: chat at 4 streams, where a verified row
# costs ~9% of the step (break-even ~0.37), drafted lookups that then kept 0.26. At one stream,
# where rows are cheap, it moves few decisions (replayed: within 2%). Both records:
# docs/speculation-measurements.md, "Lookup estimates from every lookup".
CONFIDENCE_Z = 1.0


class AcceptanceEstimate:
    """A request's per-token acceptance for one proposer.

    Drafts are verified left to right and stop at the first rejection, so a pass that accepted
    ``a`` of ``k`` drafts saw ``a`` successes in ``a + (a < k)`` trials; successes / trials is
    the maximum-likelihood alpha. Older evidence decays, so the estimate follows a request whose
    text changes character (prose, then a code block).
    """

    def __init__(self, prior: float, weight: float = 2.0) -> None:
        self.successes = prior * weight
        self.trials = weight

    @property
    def alpha(self) -> float:
        """The mean: successes over trials."""
        return min(self.successes / self.trials, MAX_ALPHA)

    @property
    def confident(self) -> float:
        """The Wilson lower bound at ``CONFIDENCE_Z`` over the (decayed) trials: what the policy
        acts on. Few trials pull it well below the mean, many leave it near."""
        p, n, z2 = self.alpha, self.trials, CONFIDENCE_Z ** 2
        centre = p + z2 / (2 * n)
        spread = CONFIDENCE_Z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
        return max((centre - spread) / (1 + z2 / n), 0.0)

    def update(self, accepted: int, proposed: int) -> None:
        """One verify pass of ``proposed`` drafts that kept ``accepted``."""
        self.successes = ACCEPTANCE_DECAY * self.successes + accepted
        self.trials = ACCEPTANCE_DECAY * self.trials + accepted + (1 if accepted < proposed else 0)

    def score(self, proposal: list[int], committed: list[int]) -> None:
        """A lookup's proposal against the tokens the step then committed: as many of its first
        tokens as were committed, up to the first that differs. For a greedy request exactly what
        verifying it would have kept; for a sampled one the same in expectation (a one-hot draft
        is kept with the probability the target gives it). A proposal longer than the committed
        tokens counts those only: no failure was seen past them."""
        kept = kept_prefix(proposal, committed)
        self.update(kept, kept + 1 if kept < min(len(proposal), len(committed)) else kept)


def prior_estimates() -> dict[Source, AcceptanceEstimate]:
    """A new request's estimates: each proposer at its ``PRIOR``."""
    return {source: AcceptanceEstimate(prior) for source, prior in PRIOR.items()}


class AcceptanceLearning:
    """A request's own acceptance per proposer (a base of ``engine.request.Request``, which starts
    ``acceptance`` at ``prior_estimates()``): what the policy acts on, and what each verify pass
    teaches. Only ``learn`` writes the estimates, and only the commit calls it."""

    acceptance: dict[Source, AcceptanceEstimate]

    def alpha(self, source: Source) -> float:
        """The acceptance the policy acts on for ``source``. A lookup's is its estimate's lower
        bound (``AcceptanceEstimate.confident``): it learns at every pass whether chosen or not
        (``learn``), so caution costs it no evidence. The draft model's is the mean, from an
        optimistic prior: it learns only from the drafts it is chosen for, so it must be tried to
        be known (probes bound what that costs)."""
        estimate = self.acceptance[source]
        return estimate.confident if source in LOOKUP_SOURCES else estimate.alpha

    def learn(self, source: Source | None, accepted: int, proposed: int, lookups: Mapping[Source, DraftTree],
              committed: list[int]) -> None:
        """One verify pass that committed ``committed`` (the target's tokens, before any stop cut).
        The draft model learns from the drafts it verified (``accepted`` of ``proposed``); every
        lookup the policy made for this pass, chosen or not (``lookups``, their first chains), is
        scored against ``committed``. A lookup costs no forward, so each learns at every pass it
        had a match: an estimate fed only by verified passes stops learning once the policy stops
        choosing its source, and needed relaxing back to the prior, which re-tried lookups that
        did not pay (chat at 4 streams kept 0.26 of them)."""
        if source == "draft" and proposed:
            self.acceptance["draft"].update(accepted, proposed)
        for lookup, proposal in lookups.items():
            self.acceptance[lookup].score(proposal.first_chain, committed)


def kept_prefix(drafts: list[int], truth: list[int]) -> int:
    """How many of ``drafts`` a greedy verification against ``truth`` keeps: their longest prefix
    equal to it."""
    n = 0
    while n < len(drafts) and n < len(truth) and drafts[n] == truth[n]:
        n += 1
    return n


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens one verify pass commits on average: the accepted drafts plus the target's own."""
    return sum(alpha ** j for j in range(k + 1))
