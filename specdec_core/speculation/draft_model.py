"""The draft-model proposer: a small model samples each request's drafts; its q is the
distribution each draft was sampled from."""

from __future__ import annotations

import torch

from specdec_core.decoding.sampling import sample, uniforms, warp
from specdec_core.engine.step_plan import ScheduledRequest
from specdec_core.execution.model_runner import ForwardItem, ModelRunner
from specdec_core.speculation.proposal import Proposal


class DraftModelProposer:
    """Drafts with a small model: one batched forward per draft position for all requests.

    The draft cache lags the target by design: a request is caught up (all its tokens since its
    ``draft_computed``) in the first forward of a step in which it drafts, and prompt chunks of
    speculating requests are mirrored while the draft model is in use (some request drafts this
    step, or nothing is decoding yet), so the catch-up rarely has to re-read a whole prompt. When the
    policy has turned drafting off (a full batch), prompts are not mirrored: that work would be
    wasted unless the request drafts later, and then the catch-up does it.
    """

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner

    @staticmethod
    def _drafts(item: ScheduledRequest) -> int:
        return item.num_drafts if item.source == "draft" else 0

    def _mirrors(self, item: ScheduledRequest, in_use: bool) -> bool:
        """Seeded sampled requests are always mirrored: how their draft cache is segmented (and
        so the last bits of their draft distributions) must not depend on the batch."""
        r = item.request
        return ((in_use or r.seeded) and self._drafts(item) == 0 and r.in_prefill
                and r.max_spec_tokens > 0 and r.draft_computed == r.num_computed)

    def _in_use(self, items: list[ScheduledRequest]) -> bool:
        return any(self._drafts(it) for it in items) or all(it.request.in_prefill for it in items)

    def wanted(self, items: list[ScheduledRequest]) -> bool:
        in_use = self._in_use(items)
        return any(self._drafts(it) or self._mirrors(it, in_use) for it in items)

    def propose(self, items: list[ScheduledRequest]) -> Proposal:
        vocab = self.runner.vocab_size
        k_max = max((self._drafts(it) for it in items), default=0)
        tokens: list[list[int]] = [[] for _ in items]
        cached: list[int | None] = [None] * len(items)
        probs = torch.zeros(len(items), k_max, vocab, device=self.runner.device)
        active = [b for b, it in enumerate(items) if self._drafts(it) > 0]
        in_use = self._in_use(items)
        mirrored = [b for b, it in enumerate(items) if self._mirrors(it, in_use)]
        fwd = [self._catch_up(items[b], 1) for b in active] + [self._catch_up(items[b], 0) for b in mirrored]
        for b in mirrored:
            cached[b] = items[b].request.num_computed + items[b].num_new
        for j in range(max(k_max, 1)):
            if j > 0:
                active = [b for b in active if self._drafts(items[b]) > j]
                fwd = [ForwardItem(items[b].request.cache_slot, cached[b], [tokens[b][-1]], 1) for b in active]  # type: ignore[arg-type]
            if not active:
                if fwd:
                    self.runner.forward(fwd)  # prompt chunks mirrored into the draft cache
                break
            logits = self.runner.forward(fwd)
            for b in active:
                cached[b] = items[b].request.num_computed + items[b].num_new + j
            reqs = [items[b].request for b in active]
            q = warp(logits[: len(active)], [r.row_params(tokens[b]) for r, b in zip(reqs, active)])
            u = uniforms([r.generator for r in reqs], 1, q.device)[:, 0]
            stuck = []
            for i, (b, x, has_mass) in enumerate(zip(active, sample(q, u).tolist(), (q.sum(dim=-1) > 0).tolist())):
                if not has_mass:  # the draft head scores no token the grammar allows here
                    stuck.append(b)
                    continue
                probs[b, j] = q[i]
                tokens[b].append(x)
            active = [b for b in active if b not in stuck]
        return Proposal(tokens, probs, cached)

    @staticmethod
    def _catch_up(item: ScheduledRequest, num_logits: int) -> ForwardItem:
        r = item.request
        return ForwardItem(r.cache_slot, r.draft_computed, r.all_ids[r.draft_computed:r.num_computed + item.num_new], num_logits)
