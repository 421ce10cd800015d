"""What the policy, the requests and the metrics share about acceptance: the proposer names, the
per-request acceptance estimate and the expected tokens of one verify pass. A leaf module, so the
request (which owns its estimates) and the policy (which reads them) need not import each other."""

from __future__ import annotations

from typing import Literal

Source = Literal["draft", "ngram", "suffix"]
LOOKUP_SOURCES: tuple[Source, ...] = ("ngram", "suffix")  # proposers that run no model: one-hot q
ACCEPTANCE_DECAY = 0.8  # weight of a request's older verify passes in its acceptance estimate
MAX_ALPHA = 0.98
# Acceptance assumed before a request has any history: optimistic enough that a lone request
# tries the draft model at once (break-even on the 2-core CPU is about 0.7) and learns its own
# alpha in a few steps, rather than waiting for a probe.
PRIOR = {"draft": 0.75, "ngram": 0.5, "suffix": 0.5}
# Per verify pass in which a lookup source was not tried, its estimate moves this much of the way
# back to its prior. Without it, 'auto' dropped a lookup for good after a few misses (four empty
# passes take 0.5 to 0.11, below a good draft model's value) even where its matches later paid
# 1.5x the draft's (issue 23); a lookup's retry costs only verification rows. The draft model's does not relax:
# its retries cost draft forwards, and probes (``policy.PROBE_INTERVAL``) already bound them.
LOOKUP_RELAX = 0.1


class AcceptanceEstimate:
    """A request's per-token acceptance for one proposer, from its own verify passes.

    Drafts are verified left to right and stop at the first rejection, so a pass that accepted
    ``a`` of ``k`` drafts saw ``a`` successes in ``a + (a < k)`` trials; successes / trials is
    the maximum-likelihood alpha. Older passes decay, so the estimate follows a request whose
    text changes character (prose, then a code block).
    """

    def __init__(self, prior: float, weight: float = 2.0, relax: float = 0.0) -> None:
        self.prior, self.relax = prior, relax
        self.successes = prior * weight
        self.trials = weight
        self.updated_at = 0  # the request's verify passes when this estimate last learned

    @property
    def alpha(self) -> float:
        """The estimate from the passes this source verified (no relaxation)."""
        return min(self.successes / self.trials, MAX_ALPHA)

    def alpha_at(self, passes: int) -> float:
        """The estimate after ``passes`` verify passes of the request: ``alpha`` moved back toward
        the prior by ``relax`` per pass since the last update (a function of the request's own
        history only, so a seeded request's choices stay independent of the batch)."""
        kept = (1.0 - self.relax) ** max(passes - self.updated_at, 0)
        return min(kept * self.alpha + (1.0 - kept) * self.prior, MAX_ALPHA)

    def update(self, accepted: int, proposed: int, passes: int = 0) -> None:
        """One verify pass of ``proposed`` drafts that kept ``accepted``, at the request's
        ``passes``-th verify pass. A relaxed estimate first takes its relaxed value, so a retry
        after a long pause starts from what the policy believed when it chose the source."""
        if self.relax:
            self.successes = self.alpha_at(passes) * self.trials
        self.successes = ACCEPTANCE_DECAY * self.successes + accepted
        self.trials = ACCEPTANCE_DECAY * self.trials + accepted + (1 if accepted < proposed else 0)
        self.updated_at = passes


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens one verify pass commits on average: the accepted drafts plus the target's own."""
    return sum(alpha ** j for j in range(k + 1))
