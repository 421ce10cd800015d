"""Continuous batching: who runs this step, and how much of whose prompt gets prefilled.

FCFS. A waiting request is admitted when a cache slot is free (slots are sized from
``max_num_seqs`` x ``max_model_len``, so a free slot is exactly "capacity allows"). Each step every
running request in decode gets 1 token (the speculation policy then adds drafts), and up to
``prefill_chunk`` prompt tokens are prefilled, so a long prompt never stalls running streams.

Prompts are cut at fixed offsets (0, C, 2C, ...) and a chunk is scheduled whole or not at all:
how a prompt is chunked, and so the arithmetic of its prefill, never depends on what else is
running. Together with the batch-invariant forward this keeps a request's logits independent of
the batch.
"""

from __future__ import annotations

import time
from collections import deque

from specdec_core.engine.request import Request, Status
from specdec_core.engine.step_plan import ScheduledRequest, ScheduledStep
from specdec_core.execution.kv_cache import SlotAllocator


class Scheduler:
    def __init__(self, max_num_seqs: int, prefill_chunk: int) -> None:
        self.slots = SlotAllocator(max_num_seqs)
        self.prefill_chunk = prefill_chunk
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledStep:
        while self.waiting and self.slots.num_free:
            req = self.waiting.popleft()
            req.slot = self.slots.allocate()
            req.status = Status.RUNNING
            req.stats.scheduled_time = time.monotonic()
            self.running.append(req)
        step = ScheduledStep()
        # Decoding requests first (1 token each, plus drafts the policy adds), then whole prompt
        # chunks while the prefill budget lasts. A chunk that finishes its prompt may carry
        # drafts too, so speculation starts at the first generated token.
        for req in self.running:
            if not req.in_prefill:
                step.items.append(ScheduledRequest(req, 1))
        budget = self.prefill_chunk
        for req in self.running:
            if req.in_prefill:
                chunk_end = min((req.num_computed // self.prefill_chunk + 1) * self.prefill_chunk, req.num_tokens)
                n = chunk_end - req.num_computed
                if n > budget:
                    break  # FCFS: a later prompt does not overtake this one
                step.items.append(ScheduledRequest(req, n))
                budget -= n
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
