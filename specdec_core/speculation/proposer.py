"""Proposers guess the next tokens of each running request; the verifier decides what stays.

Two proposers: a draft model (batched, one forward per draft position for all requests at
once; its q is the distribution each draft was sampled from) and n-gram prompt lookup (no model;
its q is one-hot on the looked-up tokens). The speculation policy picks one per request per
step; ``Proposal`` carries both kinds side by side.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec_core.execution.model_runner import ForwardItem, ModelRunner
from specdec_core.engine.scheduler import ScheduledRequest
from specdec_core.decoding.sampling import sample, uniforms, warp
from specdec_core.speculation.policy import is_seeded


@dataclass
class Proposal:
    """``tokens[b]`` are item b's drafts (possibly fewer than asked). ``probs`` is ``[B, K, V]``
    with the distributions they were drawn from (one-hot rows for looked-up tokens), or None when
    every row is one-hot. ``draft_cached[b]``, when the draft model ran, is how many of item b's
    tokens its cache now holds (drafts included); the engine's commit turns that into the
    request's ``draft_computed``. Proposing moves no request state, so a step that fails after
    it leaves nothing to undo."""

    tokens: list[list[int]]
    probs: torch.Tensor | None
    draft_cached: list[int | None] | None = None


def propose(items: list[ScheduledRequest], draft: "DraftModelProposer | None") -> Proposal:
    """Looked-up tokens where the policy chose n-gram; the draft model for the rest (and for
    mirroring prompt chunks into its cache)."""
    proposal = draft.propose(items) if draft is not None and draft.wanted(items) else None
    tokens = proposal.tokens if proposal else [[] for _ in items]
    looked_up = [b for b, it in enumerate(items) if it.source == "ngram"]
    for b in looked_up:
        tokens[b] = list(items[b].lookup or [])
    probs = proposal.probs if proposal else None
    if looked_up and probs is not None:
        k_max = max(len(t) for t in tokens)
        if probs.shape[1] < k_max:
            probs = torch.cat([probs, probs.new_zeros(len(items), k_max - probs.shape[1], probs.shape[2])], dim=1)
        for b in looked_up:
            probs[b, :len(tokens[b])] = 0.0
            probs[b, torch.arange(len(tokens[b])), torch.tensor(tokens[b], dtype=torch.long)] = 1.0
    return Proposal(tokens, probs, proposal.draft_cached if proposal else None)


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
        return ((in_use or is_seeded(r)) and self._drafts(item) == 0 and r.in_prefill
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
                fwd = [ForwardItem(items[b].request.slot, cached[b], [tokens[b][-1]], 1) for b in active]  # type: ignore[arg-type]
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
        return ForwardItem(r.slot, r.draft_computed, r.all_ids[r.draft_computed:r.num_computed + item.num_new], num_logits)


class NgramIndex:
    """Prompt lookup for one request: the most recent earlier occurrence of its last n tokens
    (n from ``max_n`` down to ``min_n``), and the tokens that followed it.

    Every n-gram that has a follower maps to where that follower is; the index catches up with
    the request's tokens on each lookup (they only grow), so a step costs O(new tokens x n)
    dictionary updates instead of a scan of the whole text per request.
    """

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n, self.max_n = min_n, max_n
        self._follower: dict[tuple[int, ...], int] = {}
        self._indexed = 0  # n-grams ending before this position are in the index

    def lookup(self, ids: list[int], k: int) -> list[int]:
        if k <= 0:
            return []
        # Register n-grams ending at positions up to len - 2: each has a follower, and the
        # request's own suffix (ending at len - 1) is not matched against itself.
        for end in range(self._indexed, len(ids) - 1):
            for n in range(self.min_n, min(self.max_n, end + 1) + 1):
                self._follower[tuple(ids[end - n + 1:end + 1])] = end + 1
        self._indexed = max(self._indexed, len(ids) - 1)
        for n in range(min(self.max_n, len(ids) - 1), self.min_n - 1, -1):
            start = self._follower.get(tuple(ids[len(ids) - n:]))
            if start is not None:
                return ids[start:start + k]
        return []
