"""Lossless verification of draft tokens (Leviathan et al. 2023; Chen et al. 2023), vectorised
over every request of a step.

For request b with drafts x_1..x_k, draft distributions q_1..q_k and target distributions
p_1..p_{k+1} (all warped identically): accept x_j with probability min(1, p_j(x_j) / q_j(x_j)) until
the first rejection; there, sample from norm(max(0, p_j - q_j)); if all k are accepted, sample the
bonus token from p_{k+1}. The emitted tokens are then distributed exactly as the target's own
samples. With greedy (one-hot) p and q this is "accept while equal to the argmax".
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec_core.decoding.sampling import sample, warp
from specdec_core.engine.request import Request


@dataclass
class VerifyResult:
    """``num_accepted[b]`` drafts accepted, then ``final_token[b]`` (replacement or bonus)."""

    num_accepted: list[int]
    final_token: list[int]


def verify(
    p: torch.Tensor,
    q: torch.Tensor,
    drafts: torch.Tensor,
    num_drafts: torch.Tensor,
    u_accept: torch.Tensor,
    u_final: torch.Tensor,
) -> VerifyResult:
    """Verify a padded batch.

    p: ``[B, K+1, V]`` target probabilities; q: ``[B, K, V]`` draft probabilities; drafts:
    ``[B, K]`` token ids; num_drafts: ``[B]`` (rows j >= num_drafts[b] are padding);
    u_accept: ``[B, K]`` and u_final: ``[B]`` uniforms from each request's generator.
    """
    bsz, k_max1, vocab = p.shape
    k_max = k_max1 - 1
    dev = p.device
    valid = torch.arange(k_max, device=dev)[None, :] < num_drafts[:, None]
    if k_max > 0:
        px = p[:, :k_max].gather(2, drafts.unsqueeze(2)).squeeze(2)
        qx = q.gather(2, drafts.unsqueeze(2)).squeeze(2)
        # u < p/q written as u*q < p: no division, and q == 0 (impossible for a real draft) rejects.
        ok = (u_accept * qx < px) & (qx > 0) & valid
        num_accepted = ok.long().cumprod(dim=1).sum(dim=1)
        # q padded with a zero row: at index k (all accepted) the residual is p itself -> bonus.
        q_pad = torch.cat([q * valid.unsqueeze(2), q.new_zeros(bsz, 1, vocab)], dim=1)
    else:
        num_accepted = torch.zeros(bsz, dtype=torch.long, device=dev)
        q_pad = p.new_zeros(bsz, 1, vocab)
    idx = num_accepted.view(bsz, 1, 1).expand(bsz, 1, vocab)
    p_at = p.gather(1, idx).squeeze(1)
    residual = (p_at - q_pad.gather(1, idx).squeeze(1)).clamp_(min=0.0)
    mass = residual.sum(dim=1, keepdim=True)
    # Float round-off can leave no residual mass where p == q; then p itself is the right law.
    residual = torch.where(mass > 0, residual, p_at)
    final = sample(residual, u_final)
    return VerifyResult(num_accepted.tolist(), final.tolist())


def verify_greedy(argmax: torch.Tensor, drafts: list[list[int]]) -> VerifyResult:
    """The temperature-0 limit of ``verify`` without building distributions: accept while a draft
    equals the target's argmax, then emit the argmax. ``argmax`` holds each request's rows
    (``len(drafts[b]) + 1`` of them) back to back."""
    bsz = len(drafts)
    k_max = max((len(d) for d in drafts), default=0)
    lengths = torch.tensor([len(d) + 1 for d in drafts], device=argmax.device)
    starts = torch.cumsum(lengths, 0) - lengths
    cols = torch.arange(k_max + 1, device=argmax.device)
    # Row index of (b, j), clamped into the request's own rows for the padding columns.
    idx = starts[:, None] + torch.minimum(cols[None, :], lengths[:, None] - 1)
    target = argmax[idx]
    tok = torch.full((bsz, k_max), -1, dtype=torch.long, device=argmax.device)
    for b, d in enumerate(drafts):
        if d:
            tok[b, : len(d)] = torch.tensor(d, device=argmax.device)
    num_accepted = (tok == target[:, :k_max]).long().cumprod(dim=1).sum(dim=1)
    final = target.gather(1, num_accepted[:, None]).squeeze(1)
    return VerifyResult(num_accepted.tolist(), final.tolist())


def verify_requests(reqs: list[Request], drafts: list[list[int]], draft_probs: torch.Tensor | None,
                    logits: torch.Tensor) -> VerifyResult:
    """Verify every request of a step: ``logits`` holds each request's ``len(drafts[b]) + 1``
    rows back to back; ``draft_probs`` ``[B, K, V]`` the draft distributions (None: all one-hot).
    p and q are warped by the same per-request rule (``Request.row_params``)."""
    dev = logits.device
    k_max = max(len(d) for d in drafts)
    rows = [r.row_params(d[:j]) for r, d in zip(reqs, drafts) for j in range(len(d) + 1)]
    probs = warp(logits, rows)
    if all(r.params.greedy for r in reqs):
        return verify_greedy(probs.argmax(dim=-1), drafts)
    bsz, vocab = len(reqs), probs.shape[1]
    p = probs.new_zeros(bsz, k_max + 1, vocab)
    q = probs.new_zeros(bsz, k_max, vocab)
    tok = torch.zeros(bsz, k_max, dtype=torch.long, device=dev)
    u = torch.zeros(bsz, k_max + 1, device=dev)
    row = 0
    for b, (r, d) in enumerate(zip(reqs, drafts)):
        n = len(d)
        p[b, : n + 1] = probs[row:row + n + 1]
        row += n + 1
        if n:
            tok[b, :n] = torch.tensor(d, device=dev)
            if draft_probs is not None:
                q[b, :n] = draft_probs[b, :n]
            else:
                q[b, torch.arange(n), tok[b, :n]] = 1.0
        # Exactly n + 1 draws from the request's own generator: reproducible whatever the batch.
        u[b, : n + 1] = torch.rand(n + 1, generator=r.generator).to(dev)
    num = torch.tensor([len(d) for d in drafts], device=dev)
    u_final = u.gather(1, num[:, None]).squeeze(1)
    return verify(p, q, tok, num, u[:, :k_max], u_final)
