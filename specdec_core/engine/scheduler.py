"""Continuous batching: who runs this step, how much of whose prompt gets prefilled, and which
KV blocks each request holds.

FCFS. A waiting request is admitted when a running place is free (``max_num_seqs``) and the
block pool can hold its prompt (plus a step's drafts). Each step every running request in decode
gets 1 token (the speculation policy then adds drafts), and up to ``prefill_chunk`` prompt tokens
are prefilled, so a long prompt never stalls running streams. A request that cannot get the
blocks its step needs takes them from the most recently admitted request, which is *preempted*:
its blocks go back to the pool and it waits at the head of the queue, to be recomputed from its
tokens (vLLM's recompute preemption). The oldest request can always take every block, and the
pool holds at least one full-length request (checked at start-up), so every request finishes.

Prompts are cut at fixed offsets (0, C, 2C, ...) and a chunk is scheduled whole or not at all,
so how much is prefilled per step never depends on what else is running. The forward computes a
prompt block by block (``attention_plans.plan_segments``), so a full block's rows are the same however the
prompt was chunked: every full prompt block in the cache is reusable by a later request with the
same prefix (``PrefixCache``): admission hands such a request the blocks that hold it, or a copy.
Where every row attends on its own (``share_outputs``), so are the blocks of its output.
"""

from __future__ import annotations

import time
from collections import deque

from specdec_core.engine.block_pool import BlockPool
from specdec_core.engine.prefix_cache import PrefixCache
from specdec_core.engine.request import Request, Status
from specdec_core.engine.step_plan import PrefixCopy, ScheduledStep
from specdec_core.execution.kv_cache import blocks_for
from specdec_core.speculation.scheduled_request import ScheduledRequest


class Scheduler:
    def __init__(self, max_num_seqs: int, prefill_chunk: int, pool: BlockPool, block_size: int,
                 prefix_caching: bool = True, share_outputs: bool = False) -> None:
        """``share_outputs``: the rows decoding writes are the rows a prefill of the same tokens
        computes (``ModelRunner.rows_alone``), so the prefix cache records output chunks too."""
        self.max_num_seqs = max_num_seqs
        self.prefill_chunk = prefill_chunk
        self.pool = pool
        self.block_size = block_size
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.prefix = PrefixCache(block_size, block_size) if prefix_caching else None
        self.share_outputs = share_outputs
        self.num_preemptions = 0
        self.lent = 0  # blocks lent to work outside requests (``lend``)

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def lend(self, fewest: int, most: int, keep: int) -> list[int]:
        """Up to ``most`` free blocks for work outside requests (a calibration while idle), leaving
        ``keep`` free (a full-length request must always fit); none if that is fewer than
        ``fewest``. Whatever cached chunk they held is gone."""
        count = min(most, self.pool.num_free - keep)
        if count < fewest:
            return []
        self.lent += count
        return self._allocate(count, [])

    def give_back(self, blocks: list[int]) -> None:
        self.pool.free(blocks)
        self.lent -= len(blocks)

    def schedule(self) -> ScheduledStep:
        step = ScheduledStep()
        while self.waiting and len(self.running) < self.max_num_seqs and self._admit(self.waiting[0], step):
            req = self.waiting.popleft()
            req.status = Status.RUNNING
            if req.stats.scheduled_time is None:
                req.stats.scheduled_time = time.monotonic()
            self.running.append(req)
        # Decoding requests first (1 token each, plus drafts the policy adds), then whole prompt
        # chunks while the prefill budget lasts. A chunk that finishes its prompt may carry
        # drafts too, so speculation starts at the first generated token.
        for req in list(self.running):
            if req in self.running and not req.in_prefill and self._reserve(req, req.num_tokens + req.max_spec_tokens, step):
                step.items.append(ScheduledRequest(req, 1))
        budget = self.prefill_chunk
        for req in list(self.running):
            if req not in self.running or not req.in_prefill:
                continue
            chunk_end = min((req.num_computed // self.prefill_chunk + 1) * self.prefill_chunk, req.num_tokens)
            n = chunk_end - req.num_computed
            if n > budget:
                break  # FCFS: a later prompt does not overtake this one
            drafts = req.max_spec_tokens if chunk_end == req.num_tokens else 0
            if not self._reserve(req, chunk_end + drafts, step):
                break
            step.items.append(ScheduledRequest(req, n))
            budget -= n
        return step

    def _admit(self, req: Request, step: ScheduledStep) -> bool:
        """Give ``req`` the blocks of its known tokens (and a step's drafts), if the pool has them
        with one to spare per running request (so that admitting it does not at once preempt
        it again). Cached prompt blocks come first: free ones are taken where they lie, those
        of running requests are copied. A seeded sampled request takes no draft rows
        from the cache: the last bits of its draft's distributions, and so its draws, must not
        depend on what ran before it."""
        need = blocks_for(req.num_tokens + req.max_spec_tokens, self.block_size)
        if self.pool.num_free < need + len(self.running):
            return False
        # Prompt log-probabilities need every prompt position's logits, which cached rows never
        # had in this request: such a request prefills all of its prompt (and records its chunks
        # for later requests as any other does; recomputed chunks are bit-identical).
        lookup = self.prefix is not None and req.params.prompt_logprobs is None
        hits = self.prefix.lookup(req.prompt_ids, self.pool.is_free, req.params.cache_salt,  # type: ignore[union-attr]
                                  req.chunk_keys) if lookup else []
        in_place = [all(self.pool.is_free(b) for b in h.blocks) for h in hits]
        for h, here in zip(hits, in_place):
            if here:
                self.pool.take(h.blocks)
        table: list[int] = []
        for h, here in zip(hits, in_place):
            if here:
                table += h.blocks
                continue
            new = self._allocate(len(h.blocks), table)
            step.copies.append(PrefixCopy(h.blocks, tuple(new), h.draft and not req.seeded))
            table += new
        table += self._allocate(need - len(table), table)
        req.blocks = table
        cached = len(hits) * self.block_size
        drafted = next((i for i, h in enumerate(hits) if not h.draft), len(hits)) * self.block_size
        req.num_computed = req.stats.cached_tokens = cached
        req.draft_computed = 0 if req.seeded else drafted
        step.cached_tokens += cached
        return True

    def _allocate(self, count: int, table: list[int]) -> list[int]:
        """``count`` blocks continuing ``table``; whatever cached chunk they held is gone."""
        new = self.pool.allocate(count, after=table[-1] if table else None)
        if self.prefix is not None:
            self.prefix.forget(new)
        return new

    def _reserve(self, req: Request, tokens: int, step: ScheduledStep) -> bool:
        """Blocks for ``req``'s first ``tokens`` positions, preempting the most recently
        admitted requests until the pool has them; False when ``req`` itself was preempted."""
        need = blocks_for(tokens, self.block_size) - len(req.blocks)
        while need > self.pool.num_free:
            victim = self.running[-1]
            self._preempt(victim, step)
            if victim is req:
                return False
        if need > 0:
            req.blocks += self._allocate(need, req.blocks)
        return True

    def _preempt(self, req: Request, step: ScheduledStep) -> None:
        """Free ``req``'s blocks and queue it first, to be recomputed from its tokens."""
        self.running.remove(req)
        step.items = [it for it in step.items if it.request is not req]
        self._release(req)
        req.num_computed = req.draft_computed = 0
        req.status = Status.WAITING
        self.waiting.appendleft(req)
        self.num_preemptions += 1

    def _release(self, req: Request) -> None:
        self.pool.free(req.blocks, self.prefix.holds if self.prefix is not None else None)
        req.blocks = []
        req.recorded_chunks = (0, 0)

    def record_cached(self, req: Request) -> None:
        """After a step, and as a request finishes: its full blocks now in the cache (of its
        prompt, and of its output where outputs are shared) become reusable."""
        if self.prefix is not None and req.blocks:
            tokens = req.all_ids if self.share_outputs else req.prompt_ids
            req.recorded_chunks = self.prefix.record(req.blocks, tokens, req.num_computed, req.draft_computed,
                                                     req.recorded_chunks, req.params.cache_salt, req.chunk_keys)
            in_cache = min(req.recorded_chunks[0] * self.prefix.chunk, len(req.prompt_ids))
            req.stats.stored_tokens = max(in_cache - req.stats.cached_tokens, 0)

    def remove(self, req: Request) -> None:
        """Drop a finished or aborted request and free its blocks at once. Its chunks, the last
        step's included, stay findable until the blocks are handed out again: its cache holds
        ``all_ids[:num_computed]`` whatever stopped it."""
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        if req.blocks:
            self.record_cached(req)
            self._release(req)

    def find(self, request_id: str) -> Request | None:
        for req in (*self.running, *self.waiting):
            if req.request_id == request_id:
                return req
        return None

    @property
    def kv_usage(self) -> float:
        return (self.pool.num_used - self.lent) / self.pool.num_blocks  # requests' blocks
