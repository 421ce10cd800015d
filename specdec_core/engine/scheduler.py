"""Continuous batching: who runs this step, and how much of whose prompt gets prefilled.

FCFS. A waiting request is admitted when a cache slot is free (slots are sized from
``max_num_seqs`` x ``max_model_len``, so a free slot is exactly "capacity allows"). Each step every
running request in decode gets 1 token (the speculation policy then adds drafts), and up to
``prefill_chunk`` prompt tokens are prefilled, so a long prompt never stalls running streams.

Prompts are cut at fixed offsets (0, C, 2C, ...) and a chunk is scheduled whole or not at all:
how a prompt is chunked, and so the arithmetic of its prefill, never depends on what else is
running. Together with the batch-invariant forward this keeps a request's logits independent of
the batch, and it makes every full prompt chunk in the cache reusable by a later request with the
same prefix (``PrefixCache``): admission hands such a request the slot that holds it, or a copy.
"""

from __future__ import annotations

import time
from collections import deque

from specdec_core.engine.prefix_cache import PrefixCache
from specdec_core.engine.request import Request, Status
from specdec_core.engine.step_plan import PrefixCopy, ScheduledRequest, ScheduledStep
from specdec_core.execution.kv_cache import SlotAllocator


class Scheduler:
    def __init__(self, max_num_seqs: int, prefill_chunk: int, prefix_caching: bool = True) -> None:
        self.slots = SlotAllocator(max_num_seqs)
        self.prefill_chunk = prefill_chunk
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.prefix = PrefixCache(prefill_chunk) if prefix_caching else None
        # Draft-cache positions a freed slot still holds (its last request's draft_computed).
        self._draft_held: dict[int, int] = {}

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledStep:
        step = ScheduledStep()
        while self.waiting and self.slots.num_free:
            req = self.waiting.popleft()
            self._admit(req, step)
            req.status = Status.RUNNING
            req.stats.scheduled_time = time.monotonic()
            self.running.append(req)
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

    def _admit(self, req: Request, step: ScheduledStep) -> None:
        """Give ``req`` a slot: the free one holding its longest cached prefix if there is one
        (nothing to copy), else the least recently freed one, with the prefix copied from where it
        is cached. A seeded sampled request takes no draft rows from the cache: the last bits of
        its draft's distributions, and so its draws, must not depend on what ran before it."""
        # Prompt log-probabilities need every prompt position's logits, which cached rows never
        # had in this request: such a request prefills all of its prompt (and records its chunks
        # for later requests as any other does; recomputed chunks are bit-identical).
        lookup = self.prefix is not None and req.params.prompt_logprobs is None
        hit = self.prefix.lookup(req.prompt_ids, self.slots.free_slots) if lookup else None  # type: ignore[union-attr]
        in_place = hit is not None and hit.slot in self.slots.free_slots
        req.slot = self.slots.allocate(hit.slot if in_place else None)  # type: ignore[union-attr]
        if self.prefix is not None:
            self.prefix.keep_only(req.cache_slot, hit.length if in_place else 0)  # type: ignore[union-attr]
        if hit is None:
            return
        source = next((r for r in self.running if r.slot == hit.slot), None)
        held = source.draft_computed if source is not None else self._draft_held.get(hit.slot, 0)
        draft = 0 if req.seeded else min(hit.length, held)
        req.num_computed = req.stats.cached_tokens = hit.length
        step.cached_tokens += hit.length
        req.draft_computed = draft
        if not in_place:
            step.copies.append(PrefixCopy(hit.slot, req.cache_slot, hit.length, draft))

    def record_prefill(self, req: Request) -> None:
        """After a step: the request's full prompt chunks now in the cache become shareable."""
        if self.prefix is not None and req.slot is not None and req.num_computed <= len(req.prompt_ids):
            self.prefix.record(req.slot, req.prompt_ids, req.num_computed)

    def remove(self, req: Request) -> None:
        """Drop a finished or aborted request and free its slot at once."""
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        if req.slot is not None:
            self._draft_held[req.slot] = min(req.draft_computed, len(req.prompt_ids))
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
