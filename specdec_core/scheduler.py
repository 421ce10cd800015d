"""Continuous batching: who runs this step, and how much of whose prompt gets prefilled.

FCFS. A waiting request is admitted when a cache slot is free (slots are sized from
``max_num_seqs`` x ``max_model_len``, so a free slot is exactly "capacity allows"). Each step the
running requests in decode go first (1 + k tokens each); the rest of the token budget prefills
prompts in chunks, so a long prompt never stalls running streams for its whole length.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from .kv_cache import SlotAllocator
from .request import Request, Status


@dataclass
class ScheduledRequest:
    """One request's share of a step: ``num_new`` known tokens fed to the target (a prompt chunk,
    or the last generated token) and ``num_drafts`` speculative tokens after them."""

    request: Request
    num_new: int
    num_drafts: int

    @property
    def completes(self) -> bool:
        """True when every known token is in the cache after this step: logits are needed."""
        return self.request.num_computed + self.num_new == self.request.num_tokens


@dataclass
class ScheduledStep:
    items: list[ScheduledRequest] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.items


class Scheduler:
    def __init__(self, max_num_seqs: int, max_num_batched_tokens: int) -> None:
        self.slots = SlotAllocator(max_num_seqs)
        self.token_budget = max_num_batched_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self, num_drafts: Callable[[Request], int]) -> ScheduledStep:
        """``num_drafts(req)`` says how many draft tokens a decoding request wants this step."""
        while self.waiting and self.slots.num_free:
            req = self.waiting.popleft()
            req.slot = self.slots.allocate()
            req.status = Status.RUNNING
            self.running.append(req)
        step = ScheduledStep()
        budget = self.token_budget
        # Decoding requests first (1 + k tokens each), then prompt chunks with what is left. A
        # chunk that finishes its prompt may carry drafts too, so speculation starts at token 1.
        for req in self.running:
            if not req.in_prefill:
                k = num_drafts(req)
                step.items.append(ScheduledRequest(req, 1, k))
                budget -= 1 + k
        for req in self.running:
            if req.in_prefill and budget > 0:
                n = min(budget, req.num_tokens - req.num_computed)
                k = num_drafts(req) if req.num_computed + n == req.num_tokens else 0
                step.items.append(ScheduledRequest(req, n, k))
                budget -= n + k
        return step

    def remove(self, req: Request) -> None:
        """Drop a finished or aborted request and free its slot at once."""
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        if req.slot is not None:
            self.slots.free(req.slot)
            req.slot = None

    def find(self, request_id: str) -> Request | None:
        for req in (*self.running, *self.waiting):
            if req.request_id == request_id:
                return req
        return None

    @property
    def kv_usage(self) -> float:
        return self.slots.num_used / self.slots.num_slots
