"""Proposers guess the next k tokens of each running request; the verifier decides what stays.

Two real proposers share one small interface: a draft model (batched, one forward per draft
position for all requests at once) and n-gram prompt lookup (no model; its q is one-hot).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from .model_runner import ForwardItem, ModelRunner
from .request import Request
from .sampling import RowParams, sample, uniforms, warp


@dataclass
class Proposal:
    """``tokens[b]`` are request b's drafts (possibly fewer than asked). ``probs`` is ``[B, K, V]``
    with the draft distributions they were sampled from, or None when q is one-hot on them."""

    tokens: list[list[int]]
    probs: torch.Tensor | None


@dataclass
class PrefillChunk:
    """A slice of a prompt fed to the target this step; the draft model mirrors it."""

    request: Request
    start: int
    length: int


class Proposer(ABC):
    method: str

    @abstractmethod
    def propose(self, reqs: list[Request], ks: list[int], prefill: list[PrefillChunk]) -> Proposal:
        """Draft up to ``ks[b]`` tokens for ``reqs[b]`` and keep any auxiliary state in step."""

    def commit(self, req: Request) -> None:
        """Called after the request's tokens were committed (rolls back stale draft state)."""


class DraftModelProposer(Proposer):
    method = "draft"

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner

    def propose(self, reqs: list[Request], ks: list[int], prefill: list[PrefillChunk]) -> Proposal:
        vocab = self.runner.vocab_size
        k_max = max(ks, default=0)
        tokens: list[list[int]] = [[] for _ in reqs]
        probs = torch.zeros(len(reqs), k_max, vocab, device=self.runner.device)
        # First forward: catch each drafting request up to its last committed token, and mirror
        # the target's prefill chunks (no logits needed for those).
        active = [b for b, k in enumerate(ks) if k > 0]
        mirrored = [c for c in prefill if c.request.draft_computed == c.start]
        items = [ForwardItem(reqs[b].slot, reqs[b].draft_computed, reqs[b].all_ids[reqs[b].draft_computed:], 1) for b in active]
        items += [ForwardItem(c.request.slot, c.start, c.request.all_ids[c.start:c.start + c.length], 0) for c in mirrored]
        for j in range(max(k_max, 1)):
            if j > 0:
                active = [b for b in active if ks[b] > j]
                items = [ForwardItem(reqs[b].slot, reqs[b].draft_computed, [tokens[b][-1]], 1) for b in active]
            if not items:
                break
            logits = self.runner.forward(items)
            for b in active:
                reqs[b].draft_computed = reqs[b].num_tokens + j
            for c in mirrored if j == 0 else []:
                c.request.draft_computed += c.length
            if not active:
                break
            rows = [RowParams(reqs[b].params, reqs[b].output_ids + tokens[b]) for b in active]
            q = warp(logits[: len(active)], rows)
            u = uniforms([reqs[b].generator for b in active], 1, q.device)[:, 0]
            for i, (b, x) in enumerate(zip(active, sample(q, u).tolist())):
                probs[b, j] = q[i]
                tokens[b].append(x)
        return Proposal(tokens, probs)

    def commit(self, req: Request) -> None:
        # Draft entries beyond the committed tokens belong to rejected drafts.
        req.draft_computed = min(req.draft_computed, req.num_tokens - 1)


class NgramProposer(Proposer):
    """Prompt lookup: find the most recent earlier occurrence of the last n tokens (n from
    ``max_n`` down to ``min_n``) and propose the tokens that followed it."""

    method = "ngram"

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n, self.max_n = min_n, max_n

    def propose(self, reqs: list[Request], ks: list[int], prefill: list[PrefillChunk]) -> Proposal:
        return Proposal([self.lookup(r.all_ids, k) if k > 0 else [] for r, k in zip(reqs, ks)], None)

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
