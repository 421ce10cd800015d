"""Logit warping and sampling shared by the draft and the target.

Losslessness needs the draft's q and the target's p to be warped by exactly the same rule
(penalties, temperature, top-k, top-p), so there is one function for both. Greedy requests get a
one-hot distribution on the argmax: the rejection rule then reduces to "accept while equal to the
argmax", so greedy and sampled requests share one vectorised verification.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specdec_core.decoding.sampling_params import SamplingParams


@dataclass
class RowParams:
    """How one logits row is warped: the request's parameters plus what depends on the row's
    position (``Request.row_params`` builds it, for draft and target rows alike)."""

    params: SamplingParams
    # Output tokens generated so far (committed + drafts before this row); only used by penalties.
    history: list[int] | None = None
    # Token ids this row must not produce (EOS and stop ids before ``min_tokens``).
    banned: list[int] = field(default_factory=list)
    # Bool [V]: the only tokens the request's grammar allows here (None: no grammar).
    allowed: torch.Tensor | None = None

    @property
    def edits_logits(self) -> bool:
        return bool(self.params.has_penalties or self.params.logit_bias or self.banned or self.allowed is not None)


def warp(logits: torch.Tensor, rows: list[RowParams]) -> torch.Tensor:
    """Turn raw logits ``[N, V]`` into the probability distributions the request samples from.

    A row left with no finite logit (a reduced draft head that scores none of the tokens a grammar
    allows) gets all-zero probabilities: the draft proposer stops drafting there."""
    logits = logits.float()
    n, vocab = logits.shape
    if any(r.edits_logits for r in rows):
        logits = logits.clone()
        for i, r in enumerate(rows):
            if r.edits_logits:
                _edit_row(logits[i], r)
    greedy = [i for i, r in enumerate(rows) if r.params.greedy]
    sampled = [i for i, r in enumerate(rows) if not r.params.greedy]
    probs = torch.zeros_like(logits)
    if greedy:
        g = torch.tensor(greedy, device=logits.device)
        probs[g, logits[g].argmax(dim=-1)] = 1.0
    if sampled:
        s = torch.tensor(sampled, device=logits.device)
        part = logits[s] / torch.tensor([rows[i].params.temperature for i in sampled], device=logits.device)[:, None]
        top_k = [rows[i].params.top_k for i in sampled]
        top_p = [rows[i].params.top_p for i in sampled]
        if any(0 < k < vocab for k in top_k) or any(p < 1.0 for p in top_p):
            part = _top_k_top_p(part, top_k, top_p)
        probs[s] = torch.softmax(part, dim=-1)
    dead = ~torch.isfinite(logits).any(dim=-1) if any(r.edits_logits for r in rows) else None
    if dead is not None and dead.any():
        probs[dead] = 0.0
    return probs


def _edit_row(row: torch.Tensor, r: RowParams) -> None:
    """Grammar mask, min_tokens ban, logit bias, then presence/frequency penalties, in place."""
    p, vocab = r.params, row.shape[0]
    if r.allowed is not None:
        row.masked_fill_(~r.allowed.to(row.device), float("-inf"))
    if r.banned:
        row[torch.tensor(r.banned, device=row.device)] = float("-inf")
    if p.logit_bias:
        ids = [t for t in p.logit_bias if t < vocab]
        row[torch.tensor(ids, dtype=torch.long, device=row.device)] += torch.tensor(
            [p.logit_bias[t] for t in ids], dtype=row.dtype, device=row.device)
    if p.has_penalties and r.history:
        counts = torch.bincount(torch.tensor(r.history, device=row.device), minlength=vocab)[:vocab].to(row.dtype)
        row -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(row.dtype)


def _top_k_top_p(logits: torch.Tensor, top_k: list[int], top_p: list[float]) -> torch.Tensor:
    """Mask out tokens outside each row's top-k and nucleus (top-p) sets."""
    vocab = logits.shape[1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=logits.device)[None, :]
    k = torch.tensor([kk if 0 < kk < vocab else vocab for kk in top_k], device=logits.device)
    drop = ranks >= k[:, None]
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    p = torch.tensor(top_p, device=logits.device, dtype=logits.dtype)
    probs = torch.softmax(sorted_logits, dim=-1)
    # Keep the smallest prefix whose mass reaches p: drop a token if the mass before it already does.
    mass_before = probs.cumsum(dim=-1) - probs
    drop |= mass_before >= p[:, None]
    drop[:, 0] = False
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(1, order, sorted_logits)


def sample(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling: one token per row from ``probs`` ``[N, V]`` using uniforms ``u`` ``[N]``.

    Uniforms come from each request's own generator, so a seeded request draws the same numbers
    whatever else shares its batch. float64 keeps the CDF exact enough for distribution tests.
    """
    cdf = probs.double().cumsum(dim=-1)
    target = (u.double() * cdf[:, -1]).unsqueeze(1)
    # right=True: the first index whose CDF exceeds the target always has positive mass.
    idx = torch.searchsorted(cdf, target, right=True).squeeze(1)
    return idx.clamp_(max=probs.shape[1] - 1)


def uniforms(generators: list[torch.Generator], count: int, device: torch.device) -> torch.Tensor:
    """``[len(generators), count]`` uniforms, row i drawn from generator i."""
    if not generators:
        return torch.empty(0, count, device=device)
    return torch.stack([torch.rand(count, generator=g) for g in generators]).to(device)
