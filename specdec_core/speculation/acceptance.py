"""What the policy, the requests and the metrics share about acceptance: the proposer names, the
per-request acceptance estimate and the expected tokens of one verify pass. A leaf module, so the
request (which owns its estimates) and the policy (which reads them) need not import each other."""

from __future__ import annotations

from typing import Literal

Source = Literal["draft", "ngram"]
ACCEPTANCE_DECAY = 0.8  # weight of a request's older verify passes in its acceptance estimate
MAX_ALPHA = 0.98
# Acceptance assumed before a request has any history: optimistic enough that a lone request
# tries the draft model at once (break-even on the 2-core CPU is about 0.7) and learns its own
# alpha in a few steps, rather than waiting for a probe.
PRIOR = {"draft": 0.75, "ngram": 0.5}


class AcceptanceEstimate:
    """A request's per-token acceptance for one proposer, from its own verify passes.

    Drafts are verified left to right and stop at the first rejection, so a pass that accepted
    ``a`` of ``k`` drafts saw ``a`` successes in ``a + (a < k)`` trials; successes / trials is
    the maximum-likelihood alpha. Older passes decay, so the estimate follows a request whose
    text changes character (prose, then a code block).
    """

    def __init__(self, prior: float, weight: float = 2.0) -> None:
        self.successes = prior * weight
        self.trials = weight

    @property
    def alpha(self) -> float:
        return min(self.successes / self.trials, MAX_ALPHA)

    def update(self, accepted: int, proposed: int) -> None:
        self.successes = ACCEPTANCE_DECAY * self.successes + accepted
        self.trials = ACCEPTANCE_DECAY * self.trials + accepted + (1 if accepted < proposed else 0)


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens one verify pass commits on average: the accepted drafts plus the target's own."""
    return sum(alpha ** j for j in range(k + 1))
