"""The plan of one step: which requests run, how many known tokens each feeds, how many drafts
each verifies and who proposes them. The scheduler fills ``num_new``, the speculation policy
``num_drafts`` and ``source``; proposers, the forward and the commit only read it."""

from __future__ import annotations

from dataclasses import dataclass, field

from specdec_core.engine.request import Request
from specdec_core.speculation.acceptance import Source


@dataclass
class ScheduledRequest:
    """One request's share of a step: ``num_new`` known tokens fed to the target (a prompt chunk,
    or the last generated token) and ``num_drafts`` speculative tokens after them, proposed by
    ``source``."""

    request: Request
    num_new: int
    num_drafts: int = 0
    source: Source | None = None
    # Every lookup the policy made for this request this step, chosen or not (their first
    # chains): the commit scores each against the tokens it commits (``Request.learn``).
    lookups: dict[Source, list[int]] = field(default_factory=dict)

    @property
    def completes(self) -> bool:
        """True when every known token is in the cache after this step: logits are needed."""
        return self.request.num_computed + self.num_new == self.request.num_tokens

    @property
    def prompt_rows(self) -> int:
        """Rows of this step whose logits score the next prompt token, for a request that asks for
        prompt log-probabilities: every prompt position fed now but the prompt's last (its logits
        start the answer, as for every request). 0 for everyone else: they pay nothing."""
        r = self.request
        if r.params.prompt_logprobs is None or not r.in_prefill:
            return 0
        return max(min(r.num_computed + self.num_new, len(r.prompt_ids) - 1) - r.num_computed, 0)  # 0: recomputing output


@dataclass(frozen=True)
class PrefixCopy:
    """Before the step runs: copy a cached prompt chunk from blocks ``src`` (a running request's)
    into an admitted request's blocks ``dst``; the draft model's rows too where ``draft``."""

    src: tuple[int, ...]
    dst: tuple[int, ...]
    draft: bool


@dataclass
class ScheduledStep:
    items: list[ScheduledRequest] = field(default_factory=list)
    copies: list[PrefixCopy] = field(default_factory=list)
    cached_tokens: int = 0  # prompt tokens admitted requests found in the prefix cache

    @property
    def empty(self) -> bool:
        return not self.items
