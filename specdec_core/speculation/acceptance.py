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
# alpha in a few steps, rather than waiting for a probe. For the lookups this is only where the
# server's own traffic starts (``TrafficAcceptance``): unseeded requests start from, and relax
# back to, what lookups have been keeping lately.
PRIOR: dict[Source, float] = {"draft": 0.75, "ngram": 0.5, "suffix": 0.5}
# Per verify pass in which a lookup source was not tried, its estimate moves this much of the way
# back to its prior. Without it, 'auto' dropped a lookup for good after a few misses (four empty
# passes take 0.5 to 0.11, below a good draft model's value) even where its matches later paid
# 1.5x the draft's (issue 23); a lookup's retry costs only verification rows. The draft model's does not relax:
# its retries cost draft forwards, and probes (``policy.PROBE_INTERVAL``) already bound them.
LOOKUP_RELAX = 0.1
# Weight of older verify passes in the server-wide estimate, per pass of any request: it follows
# the last few hundred passes (minutes of traffic at one stream, seconds at sixteen).
TRAFFIC_DECAY = 0.995


class AcceptanceEstimate:
    """A request's per-token acceptance for one proposer, from its own verify passes.

    Drafts are verified left to right and stop at the first rejection, so a pass that accepted
    ``a`` of ``k`` drafts saw ``a`` successes in ``a + (a < k)`` trials; successes / trials is
    the maximum-likelihood alpha. Older passes decay, so the estimate follows a request whose
    text changes character (prose, then a code block).
    """

    def __init__(self, prior: float, weight: float = 2.0, relax: float = 0.0, decay: float = ACCEPTANCE_DECAY) -> None:
        self.prior, self.relax, self.decay = prior, relax, decay
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
        self.successes = self.decay * self.successes + accepted
        self.trials = self.decay * self.trials + accepted + (1 if accepted < proposed else 0)
        self.updated_at = passes


class TrafficAcceptance:
    """What each lookup source would have kept lately across all requests: the prior an unseeded
    request starts from and relaxes back to (``LOOKUP_RELAX``), instead of a fixed 0.5.

    A fixed prior tells every new request, and every request that paused a lookup, that half its
    drafts will be kept. Where traffic keeps far fewer, at several streams, where a verified row
    costs a tenth of a step on the CPU, that re-tried lookups that did not pay: chat at 4 streams
    drafted 1,367 lookup tokens and kept 0.26 of them, 0.93x speculation off (2026-11-27).

    A lookup costs no forward, so every lookup the policy made for a request, chosen or not, is
    scored against the tokens the step then committed (``score``): as many of its first tokens as
    were committed, up to the first that differs. For greedy requests that is exactly what
    verifying it would have kept, and in expectation for sampled ones (a one-hot draft is kept with
    the probability the target gives it). An estimate fed only by verified passes locked itself
    out: once a lookup's prior fell below the other's, it was never chosen, so never learned again.
    Seeded sampled requests keep the fixed prior, so their depth depends on their own history only.
    """

    def __init__(self) -> None:
        self._estimates = {s: AcceptanceEstimate(PRIOR[s], decay=TRAFFIC_DECAY) for s in LOOKUP_SOURCES}

    def score(self, proposals: dict[Source, list[int]], committed: list[int]) -> None:
        """One request's step: each source's proposal (its first chain) against the tokens the
        step committed after the point it was proposed at. A proposal that outlives them counts
        its matched tokens only (no failure seen yet)."""
        if not committed:
            return  # the request failed: nothing to score against
        for source, tokens in proposals.items():
            matched = next((j for j, (a, b) in enumerate(zip(tokens, committed)) if a != b), min(len(tokens), len(committed)))
            failed = matched < len(tokens) and matched < len(committed)
            self._estimates[source].update(matched, matched + 1 if failed else matched)

    def priors(self) -> dict[Source, float]:
        """Each source's prior for a new unseeded request: the lookups' from the traffic."""
        return {**PRIOR, **{s: e.alpha for s, e in self._estimates.items()}}


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens one verify pass commits on average: the accepted drafts plus the target's own."""
    return sum(alpha ** j for j in range(k + 1))
