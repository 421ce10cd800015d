"""Logit warping and sampling shared by the draft and the target.

Losslessness needs the draft's q and the target's p to be warped by exactly the same rule
(penalties, temperature, top-k, top-p), so there is one rule for both: a request describes each
logits row with a ``RowParams`` (``Request.row_params``), the rows of a step become one
``WarpTable`` of device tensors, and ``apply`` warps any number of rows with a fixed number of
tensor ops: nothing per row, no host round trip. Greedy requests get a one-hot distribution on the
argmax: the rejection rule then reduces to "accept while equal to the argmax", so greedy and
sampled requests share one vectorised verification.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specdec_core.decoding.sampling_params import SamplingParams
from specdec_core.execution.host_upload import HostUpload, Ref


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


@dataclass
class WarpTable:
    """The warping rules of N rows as device tensors. Host-side flags only decide which ops run
    (known when the step is planned), never which rows they touch."""

    temperature: torch.Tensor  # [N] float32 (1 on greedy rows: unused there)
    greedy: torch.Tensor  # [N] bool
    top_k: torch.Tensor  # [N] long (vocab where off)
    top_p: torch.Tensor  # [N] float32
    all_greedy: bool
    any_greedy: bool
    truncates: bool  # some row uses top-k or top-p
    banned: torch.Tensor | None = None  # flat indices row * V + token, set to -inf
    bias: tuple[torch.Tensor, torch.Tensor] | None = None  # flat indices and values added
    # frequency [N], presence [N] and the committed tokens' counts [N, V]
    penalties: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    # Drafts before each row, counted on the device (they are drawn there): row and flat index
    # into the step's ``[B, K]`` drafts tensor of each (row, earlier draft) pair.
    draft_history: tuple[torch.Tensor, torch.Tensor] | None = None
    allowed: torch.Tensor | None = None  # [N, V] bool (grammar), set before ``apply`` when needed

    @property
    def edits(self) -> bool:
        return self.banned is not None or self.bias is not None or self.penalties is not None or self.allowed is not None


@dataclass
class TablePlan:
    """The host half of a ``WarpTable``: its values placed in a step's ``HostUpload``."""

    rows: int
    vocab: int
    scalars: Ref  # temperature, top_p, frequency, presence: 4 floats per row
    ints: Ref  # greedy, top_k: 2 ints per row
    banned: Ref | None
    bias_index: Ref | None
    bias_value: Ref | None
    counts: Ref | None
    draft_history: tuple[Ref, Ref] | None
    all_greedy: bool
    any_greedy: bool
    truncates: bool

    @classmethod
    def of(cls, rows: list[RowParams], vocab: int, upload: HostUpload,
           draft_history: list[tuple[int, int]] | None = None) -> "TablePlan":
        """``draft_history``: (row, flat draft index) for each draft that precedes a row whose
        request has penalties; those counts are added on the device, where the drafts are."""
        floats: list[float] = []
        ints: list[int] = []
        banned: list[int] = []
        bias_index: list[int] = []
        bias_value: list[float] = []
        counts: list[int] = []
        for i, r in enumerate(rows):
            p, base = r.params, i * vocab
            floats += (1.0 if p.greedy else p.temperature, p.top_p, p.frequency_penalty, p.presence_penalty)
            ints += (int(p.greedy), p.top_k if 0 < p.top_k < vocab else vocab)
            banned += (base + t for t in r.banned)
            for t, v in p.logit_bias.items():
                if t < vocab:
                    bias_index.append(base + t)
                    bias_value.append(v)
            if p.has_penalties and r.history:
                counts += (base + t for t in r.history if t < vocab)
        greedy = [r.params.greedy for r in rows]
        return cls(
            len(rows), vocab, upload.floats(floats), upload.ints(ints),
            upload.ints(banned) if banned else None,
            upload.ints(bias_index) if bias_index else None,
            upload.floats(bias_value) if bias_value else None,
            upload.ints(counts) if any(r.params.has_penalties for r in rows) else None,
            (upload.ints(r for r, _ in draft_history), upload.ints(d for _, d in draft_history)) if draft_history else None,
            all(greedy), any(greedy),
            any(not r.params.greedy and (0 < r.params.top_k < vocab or r.params.top_p < 1.0) for r in rows),
        )

    def table(self, upload: HostUpload) -> WarpTable:
        scalars = upload[self.scalars].view(self.rows, 4).float()
        ints = upload[self.ints].view(self.rows, 2)
        t = WarpTable(scalars[:, 0], ints[:, 0].bool(), ints[:, 1], scalars[:, 1],
                      self.all_greedy, self.any_greedy, self.truncates)
        if self.banned is not None:
            t.banned = upload[self.banned]
        if self.bias_index is not None and self.bias_value is not None:
            t.bias = upload[self.bias_index], upload[self.bias_value].float()
        if self.counts is not None:
            counts = scalars.new_zeros(self.rows * self.vocab)
            index = upload[self.counts]
            counts.index_add_(0, index, torch.ones_like(index, dtype=counts.dtype))
            t.penalties = scalars[:, 2], scalars[:, 3], counts.view(self.rows, self.vocab)
        if self.draft_history is not None:
            t.draft_history = upload[self.draft_history[0]], upload[self.draft_history[1]]
        return t


def stack_masks(masks: list[torch.Tensor | None], vocab: int, device: torch.device) -> torch.Tensor | None:
    """Grammar masks (None: no grammar) as one ``[N, V]`` tensor in one upload; None if no row has one."""
    if all(m is None for m in masks):
        return None
    full = torch.ones(vocab, dtype=torch.bool)
    return torch.stack([full if m is None else m for m in masks]).to(device)


def build_table(rows: list[RowParams], vocab: int, device: torch.device) -> WarpTable:
    """A ``WarpTable`` for ``rows`` on its own (one upload); steps share one upload instead."""
    upload = HostUpload()
    plan = TablePlan.of(rows, vocab, upload)
    table = plan.table(upload.send(device))
    table.allowed = stack_masks([r.allowed for r in rows], vocab, device)
    return table


def warp(logits: torch.Tensor, rows: list[RowParams]) -> torch.Tensor:
    """Raw logits ``[N, V]`` -> the distributions the rows sample from (see ``apply``)."""
    return apply(logits, build_table(rows, logits.shape[1], logits.device))


def apply(logits: torch.Tensor, t: WarpTable, drafts: torch.Tensor | None = None) -> torch.Tensor:
    """Turn raw logits ``[N, V]`` into the probability distributions the rows sample from:
    grammar mask, ``min_tokens`` ban, logit bias, presence/frequency penalties, then one-hot argmax
    (greedy rows) or temperature, top-k/top-p and softmax.

    A row left with no finite logit (a reduced draft head that scores none of the tokens a grammar
    allows) gets all-zero probabilities: verification rejects whatever was drawn from it.
    ``drafts``: the step's ``[B, K]`` draft tokens, counted by the penalties of later rows."""
    logits = _edit(logits, t, drafts)
    if t.any_greedy:
        onehot = torch.zeros_like(logits).scatter_(1, logits.argmax(dim=-1, keepdim=True), 1.0)
    if t.all_greedy:
        probs = onehot
    else:
        probs = torch.softmax(_scale(logits, t), dim=-1)
        if t.any_greedy:
            probs = torch.where(t.greedy[:, None], onehot, probs)
    if t.edits:
        probs = probs.masked_fill(~torch.isfinite(logits).any(dim=-1, keepdim=True), 0.0)
    return probs


def processed_scores(logits: torch.Tensor, t: WarpTable, drafts: torch.Tensor | None = None) -> torch.Tensor:
    """Scores whose log-softmax is the distribution each row samples from (``apply``'s rule
    before the softmax): edited logits, then temperature, top-k and top-p on sampled rows; a
    greedy row keeps its edited logits (its one-hot law says nothing about the alternatives).
    What ``logprobs_mode: processed_logprobs`` reports; rows that rule a token out hold -inf."""
    logits = _edit(logits, t, drafts)
    if t.all_greedy:
        return logits
    scaled = _scale(logits, t)
    return torch.where(t.greedy[:, None], logits, scaled) if t.any_greedy else scaled


def _edit(logits: torch.Tensor, t: WarpTable, drafts: torch.Tensor | None) -> torch.Tensor:
    """Grammar mask, ``min_tokens`` ban, logit bias and penalties: what every row's law starts from."""
    logits = logits.float()
    n, vocab = logits.shape
    if t.allowed is not None:
        logits = logits.masked_fill(~t.allowed, float("-inf"))
    if t.banned is not None:
        logits = logits.reshape(-1).index_fill(0, t.banned, float("-inf")).view(n, vocab)
    if t.bias is not None:
        logits = logits.reshape(-1).index_add(0, t.bias[0], t.bias[1]).view(n, vocab)
    if t.penalties is not None:
        freq, presence, counts = t.penalties
        if t.draft_history is not None and drafts is not None:
            rows, src = t.draft_history
            counts = counts.reshape(-1).index_add(0, rows * vocab + drafts.reshape(-1)[src],
                                                  torch.ones_like(rows, dtype=counts.dtype)).view(n, vocab)
        logits = logits - (freq[:, None] * counts + presence[:, None] * (counts > 0).float())
    return logits


def _scale(logits: torch.Tensor, t: WarpTable) -> torch.Tensor:
    """Temperature, then top-k / top-p: sampled rows' scores before the softmax."""
    scaled = logits / t.temperature[:, None]
    if t.truncates:
        scaled = _top_k_top_p(scaled, t.top_k, t.top_p)
    return scaled


def _top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Mask out tokens outside each row's top-k and nucleus (top-p) sets."""
    vocab = logits.shape[1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=logits.device)[None, :]
    drop = ranks >= top_k[:, None]
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    probs = torch.softmax(sorted_logits, dim=-1)
    # Keep the smallest prefix whose mass reaches p: drop a token if the mass before it already does.
    mass_before = probs.cumsum(dim=-1) - probs
    drop |= mass_before >= top_p.to(logits.dtype)[:, None]
    drop[:, 0] = False
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(1, order, sorted_logits)


def sample(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling: one token per row from ``probs`` ``[N, V]`` using uniforms ``u`` ``[N]``.

    Uniforms come from each request's own stream, so a seeded request draws the same numbers
    whatever else shares its batch. float64 keeps the CDF exact enough for distribution tests.
    """
    cdf = probs.double().cumsum(dim=-1)
    target = (u.double() * cdf[:, -1]).unsqueeze(1)
    # right=True: the first index whose CDF exceeds the target always has positive mass.
    idx = torch.searchsorted(cdf, target, right=True).squeeze(1)
    return idx.clamp_(max=probs.shape[1] - 1)
