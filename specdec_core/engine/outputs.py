"""What the engine hands back: one ``RequestOutput`` delta per step that produced something."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from specdec_core.decoding.token_logprob import TokenLogprob
from specdec_core.engine.provenance import TextPiece
from specdec_core.engine.stats import acceptance_rate, count_into, mean_accepted_length

FinishReason = Literal["stop", "length", "abort", "error"]


@dataclass
class RequestStats:
    """Per-request counters; ``accepted_histogram[j]`` counts verify steps that accepted j drafts."""

    prompt_tokens: int = 0
    # Prompt tokens found in the prefix cache (not prefilled again): OpenAI's ``cached_tokens``.
    cached_tokens: int = 0
    # Prompt tokens this request wrote into the prefix cache (its full chunks it computed itself):
    # Anthropic's ``cache_creation_input_tokens``.
    stored_tokens: int = 0
    completion_tokens: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    verify_steps: int = 0
    accepted_histogram: list[int] = field(default_factory=list)
    arrival_time: float = 0.0
    # When the scheduler first admitted it to the running batch: queue time ends, prefill begins.
    scheduled_time: float | None = None
    first_token_time: float | None = None
    finish_time: float | None = None

    @property
    def acceptance_rate(self) -> float:
        return acceptance_rate(self.accepted_tokens, self.draft_tokens)

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per target verify step (accepted drafts + the target's own token)."""
        return mean_accepted_length(self.completion_tokens, self.verify_steps)

    @classmethod
    def total(cls, stats: Iterable[RequestStats | None]) -> RequestStats:
        """The counters of several requests summed (an OpenAI request with ``n`` choices is ``n``
        engine requests, but reports one ``speculative`` object); ``None`` (a choice that never
        finished) counts nothing. Timestamps are per request and stay unset."""
        total = cls()
        for s in stats:
            if s is None:
                continue
            total.prompt_tokens += s.prompt_tokens
            total.cached_tokens += s.cached_tokens
            total.stored_tokens += s.stored_tokens
            total.completion_tokens += s.completion_tokens
            total.draft_tokens += s.draft_tokens
            total.accepted_tokens += s.accepted_tokens
            total.verify_steps += s.verify_steps
            for accepted, count in enumerate(s.accepted_histogram):
                count_into(total.accepted_histogram, accepted, count)
        return total

    def record_verify(self, emitted: int, drafts: int, accepted: int) -> None:
        """One verify pass that emitted ``emitted`` tokens and kept ``accepted`` of ``drafts``."""
        self.completion_tokens += emitted
        self.verify_steps += 1
        if drafts:
            self.draft_tokens += drafts
            self.accepted_tokens += accepted
            count_into(self.accepted_histogram, accepted)


@dataclass
class RequestOutput:
    """A delta for one request: the tokens and text emitted since the previous delta.

    ``text`` deltas concatenate to the decoded completion (stop string excluded). The last delta
    has ``finished=True`` and a ``finish_reason``; with ``finish_reason == "error"`` the ``error``
    field says what went wrong.

    ``sources[i]`` says how ``token_ids[i]`` was produced: the name of the proposer whose draft
    the target accepted (``"draft"``, ``"ngram"``, ...) or ``"target"`` (sampled by the target).
    ``provenance`` (only for requests with ``SamplingParams.provenance``) is ``text`` split into
    pieces by the source of the token that wrote each; the pieces concatenate to ``text``.
    """

    request_id: str
    token_ids: list[int]
    text: str
    finished: bool = False
    finish_reason: FinishReason | None = None
    logprobs: list[TokenLogprob] | None = None
    error: str | None = None
    stats: RequestStats | None = None
    # With the first delta of a request that asked for them: one entry per prompt token, the
    # first ``None`` (nothing predicts it).
    prompt_logprobs: list[TokenLogprob | None] | None = None
    sources: list[str] = field(default_factory=list)
    provenance: list[TextPiece] | None = None
