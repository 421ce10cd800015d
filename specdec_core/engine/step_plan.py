"""The plan of one step: which requests run (``ScheduledRequest``, defined in speculation/ so the
policy and the proposers read it without importing the engine), how many known tokens each
feeds, how many drafts each verifies and who proposes them, and the prefix-cache copies before
it. The scheduler fills ``num_new``, the speculation policy ``num_drafts``, ``source`` and the
looked-up drafts (``looked_up``); proposers, the forward and the commit only read it."""

from __future__ import annotations

from dataclasses import dataclass, field

from specdec_core.engine.request import Request
from specdec_core.speculation.scheduled_request import ScheduledRequest


@dataclass(frozen=True)
class PrefixCopy:
    """Before the step runs: copy a cached prompt chunk from blocks ``src`` (a running request's)
    into an admitted request's blocks ``dst``; the draft model's rows too where ``draft``."""

    src: tuple[int, ...]
    dst: tuple[int, ...]
    draft: bool


@dataclass
class ScheduledStep:
    items: list[ScheduledRequest[Request]] = field(default_factory=list)
    copies: list[PrefixCopy] = field(default_factory=list)
    cached_tokens: int = 0  # prompt tokens admitted requests found in the prefix cache

    @property
    def empty(self) -> bool:
        return not self.items
