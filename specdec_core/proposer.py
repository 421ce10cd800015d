"""Proposers guess the next k tokens of each running request; the verifier decides what stays.

Two real proposers share one small interface: a draft model (batched, one forward per draft
position for all requests at once) and n-gram prompt lookup (no model; its q is one-hot).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from .model_runner import ForwardItem, ModelRunner
from .scheduler import ScheduledRequest
from .sampling import RowParams, sample, uniforms, warp


@dataclass
class Proposal:
    """``tokens[b]`` are item b's drafts (possibly fewer than asked). ``probs`` is ``[B, K, V]``
    with the draft distributions they were sampled from, or None when q is one-hot on them.
    ``draft_cached[b]``, when a draft model ran, is how many of item b's tokens its cache now holds
    (drafts included); the engine's commit turns that into the request's ``draft_computed``. The
    proposer itself moves no request state, so a step that fails after it leaves nothing to undo."""

    tokens: list[list[int]]
    probs: torch.Tensor | None
    draft_cached: list[int | None] | None = None


class Proposer(ABC):
    method: str

    @abstractmethod
    def propose(self, items: list[ScheduledRequest]) -> Proposal:
        """Draft up to ``item.num_drafts`` tokens for each item; move no request state (the
        engine's commit applies ``Proposal.draft_cached``)."""


class DraftModelProposer(Proposer):
    """Drafts with a small model: one batched forward per draft position for all requests.

    The draft cache lags the target by design: a request is caught up (all its tokens since its
    ``draft_computed``) in the first forward of a step in which it drafts, and prompt chunks of
    speculating requests are mirrored so the catch-up never has to re-read a whole prompt.
    """

    method = "draft"

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner

    def propose(self, items: list[ScheduledRequest]) -> Proposal:
        vocab = self.runner.vocab_size
        k_max = max((it.num_drafts for it in items), default=0)
        tokens: list[list[int]] = [[] for _ in items]
        cached: list[int | None] = [None] * len(items)
        probs = torch.zeros(len(items), k_max, vocab, device=self.runner.device)
        active = [b for b, it in enumerate(items) if it.num_drafts > 0]
        mirrored = [b for b, it in enumerate(items) if it.num_drafts == 0 and it.request.in_prefill
                    and it.request.max_spec_tokens > 0 and it.request.draft_computed == it.request.num_computed]
        fwd = [self._catch_up(items[b], 1) for b in active] + [self._catch_up(items[b], 0) for b in mirrored]
        for b in mirrored:
            cached[b] = items[b].request.num_computed + items[b].num_new
        for j in range(max(k_max, 1)):
            if j > 0:
                active = [b for b in active if items[b].num_drafts > j]
                fwd = [ForwardItem(items[b].request.slot, cached[b], [tokens[b][-1]], 1) for b in active]  # type: ignore[arg-type]
            if not active:
                if fwd:
                    self.runner.forward(fwd)  # prompt chunks mirrored into the draft cache
                break
            logits = self.runner.forward(fwd)
            for b in active:
                cached[b] = items[b].request.num_computed + items[b].num_new + j
            reqs = [items[b].request for b in active]
            q = warp(logits[: len(active)], [RowParams(r.params, r.output_ids + tokens[b] if r.params.has_penalties else None) for r, b in zip(reqs, active)])
            u = uniforms([r.generator for r in reqs], 1, q.device)[:, 0]
            for i, (b, x) in enumerate(zip(active, sample(q, u).tolist())):
                probs[b, j] = q[i]
                tokens[b].append(x)
        return Proposal(tokens, probs, cached)

    @staticmethod
    def _catch_up(item: ScheduledRequest, num_logits: int) -> ForwardItem:
        r = item.request
        return ForwardItem(r.slot, r.draft_computed, r.all_ids[r.draft_computed:r.num_computed + item.num_new], num_logits)


class NgramProposer(Proposer):
    """Prompt lookup: find the most recent earlier occurrence of the last n tokens (n from
    ``max_n`` down to ``min_n``) and propose the tokens that followed it."""

    method = "ngram"

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n, self.max_n = min_n, max_n

    def propose(self, items: list[ScheduledRequest]) -> Proposal:
        return Proposal([self.lookup(it.request.all_ids, it.num_drafts) if it.num_drafts else [] for it in items], None)

    def lookup(self, ids: list[int], k: int) -> list[int]:
        seq = torch.tensor(ids)
        for n in range(min(self.max_n, len(ids) - 1), self.min_n - 1, -1):
            # Windows that start early enough to be followed by at least one token.
            windows = seq[: len(ids) - 1].unfold(0, n, 1)
            hits = (windows == seq[-n:]).all(dim=1).nonzero()
            if len(hits):
                start = int(hits[-1]) + n
                return ids[start:start + k]
        return []
