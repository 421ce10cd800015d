"""Lossless verification of draft tokens (Leviathan et al. 2023; Chen et al. 2023), vectorised
over every request of a step, on the device.

For request b with drafts x_1..x_k, draft distributions q_1..q_k and target distributions
p_1..p_{k+1} (all warped identically): accept x_j with probability min(1, p_j(x_j) / q_j(x_j)) until
the first rejection; there, sample from norm(max(0, p_j - q_j)); if all k are accepted, sample the
bonus token from p_{k+1}. The emitted tokens are then distributed exactly as the target's own
samples. With greedy (one-hot) p and q this is "accept while equal to the argmax".

Everything here is a fixed number of tensor ops whatever the batch; the engine reads the outcome
(drafts, accepted counts, final tokens) to the host in one transfer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec_core.decoding.sampling import TablePlan, apply, sample
from specdec_core.execution.host_upload import HostUpload, Ref
from specdec_core.speculation.tree_verifier import TreeResult, verify_tree, verify_tree_greedy


@dataclass
class VerifyResult:
    """``num_accepted[b]`` drafts accepted, then ``final_token[b]`` (replacement or bonus)."""

    num_accepted: torch.Tensor | list[int]
    final_token: torch.Tensor | list[int]


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
    u_accept: ``[B, K]`` and u_final: ``[B]`` uniforms from each request's own stream.
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
    return VerifyResult(num_accepted, sample(residual, u_final))


def verify_greedy(target: torch.Tensor, drafts: torch.Tensor, num_drafts: torch.Tensor) -> VerifyResult:
    """The temperature-0 limit of ``verify`` without building distributions: accept while a draft
    equals the target's argmax, then emit the argmax. ``target`` ``[B, K+1]`` holds each
    request's argmax per row; ``drafts`` ``[B, K]``; ``num_drafts`` ``[B]``."""
    k_max = drafts.shape[1]
    valid = torch.arange(k_max, device=drafts.device)[None, :] < num_drafts[:, None]
    num_accepted = ((drafts == target[:, :k_max]) & valid).long().cumprod(dim=1).sum(dim=1)
    return VerifyResult(num_accepted, target.gather(1, num_accepted[:, None]).squeeze(1))


@dataclass
class VerifyPlan:
    """The host half of a step's verification, in the step's upload: for each item b its logits
    rows ``rows[b, j]`` (j <= num_drafts[b], clamped into its own rows), whether its q is one-hot
    (n-gram drafts, or none), and the target rows' warping rules in logits order."""

    rows: Ref
    num_drafts: Ref
    one_hot: Ref
    table: TablePlan
    k_max: int
    parents: Ref | None = None  # [B, K] when some item's drafts are a token tree (``tree_verifier``)

    @classmethod
    def of(cls, num_rows: list[int], num_drafts: list[int], one_hot: list[bool], table: TablePlan,
           k_max: int, upload: HostUpload, parents: list[list[int]] | None = None) -> "VerifyPlan":
        """``num_rows[b]``: item b's logits rows (0: it is still in prefill and verifies nothing);
        ``parents[b]``: item b's draft tree's parents (a chain's are j - 1), where a tree is in the step."""
        rows, start = [], 0
        for n in num_rows:
            rows += [start + min(j, max(n - 1, 0)) for j in range(k_max + 1)]
            start += n
        tree = upload.ints(p for ps in parents for p in (ps + [-1] * k_max)[:k_max]) if parents is not None else None
        return cls(upload.ints(rows), upload.ints(num_drafts), upload.ints(int(x) for x in one_hot), table, k_max, tree)


@dataclass(frozen=True)
class VerifiedRow:
    """One item's row of ``verify_step``'s packed result, read on the host: the layout is named
    here, beside the packing, so no reader counts offsets. ``drafts``: the ``k_max`` drafts as
    verified (padding after the item's own), ``accepted`` of them kept, then ``final``;
    ``path``: the accepted nodes of a token tree (empty without trees in the step)."""

    drafts: list[int]
    accepted: int
    final: int
    path: list[int]

    @classmethod
    def of(cls, row: list[int], k_max: int) -> VerifiedRow:
        return cls(row[:k_max], row[k_max], row[k_max + 1], row[k_max + 2:k_max + 2 + row[k_max]])


def verify_step(logits: torch.Tensor, plan: VerifyPlan, upload: HostUpload, drafts: torch.Tensor,
                draft_probs: torch.Tensor | None, u: torch.Tensor, masks: torch.Tensor | None) -> torch.Tensor:
    """Warp the target rows, verify every item, and pack ``[B, K+2]``: its drafts, how many were
    accepted, the token that follows them. ``u`` ``[B, K+1]``: each item's uniforms; ``masks``:
    grammar masks of the target rows (None without grammars). With token trees in the step
    (``plan.parents``) it packs ``[B, 2K+2]``: the drafts, how many were accepted, the token that
    follows, then the accepted path's nodes (a chain's path is its first drafts). ``VerifiedRow``
    reads a row of either."""
    table = plan.table.table(upload)
    table.allowed = masks
    bsz, k_max = drafts.shape
    rows, num = upload[plan.rows].view(bsz, k_max + 1), upload[plan.num_drafts]
    probs = apply(logits, table, drafts)
    if plan.parents is not None:
        return _verify_trees(probs, rows, upload[plan.parents].view(bsz, k_max), drafts, num, u, table.all_greedy,
                             draft_probs, upload[plan.one_hot].bool())
    if table.all_greedy:
        result = verify_greedy(probs.argmax(dim=-1)[rows], drafts, num)
    else:
        p = probs.index_select(0, rows.reshape(-1)).view(bsz, k_max + 1, -1)
        q = torch.zeros_like(p[:, :k_max]).scatter_(2, drafts[:, :, None], 1.0)
        if draft_probs is not None:
            q = torch.where(upload[plan.one_hot].bool()[:, None, None], q, draft_probs)
        result = verify(p, q, drafts, num, u[:, :k_max], u.gather(1, num[:, None]).squeeze(1))
    accepted = torch.as_tensor(result.num_accepted, device=drafts.device)
    final = torch.as_tensor(result.final_token, device=drafts.device)
    return torch.cat([drafts, accepted[:, None], final[:, None]], dim=1)


def _verify_trees(probs: torch.Tensor, rows: torch.Tensor, parents: torch.Tensor, drafts: torch.Tensor,
                  num: torch.Tensor, u: torch.Tensor, greedy: bool, draft_probs: torch.Tensor | None,
                  one_hot: torch.Tensor) -> torch.Tensor:
    """A step with token trees: one-hot items (trees and lookup chains) by the tree rule, which on
    a chain is the linear one; where the draft model drew, its q needs the linear rule (its
    items are chains: their path is their drafts)."""
    bsz, k_max = drafts.shape
    if greedy:
        tree = verify_tree_greedy(probs.argmax(dim=-1)[rows], drafts, parents, num)
    else:
        p = probs.index_select(0, rows.reshape(-1)).view(bsz, k_max + 1, -1)
        tree = verify_tree(p, drafts, parents, num, u[:, :k_max], u.gather(1, num[:, None]).squeeze(1))
        if draft_probs is not None:
            q = torch.where(one_hot[:, None, None], torch.zeros_like(draft_probs).scatter_(2, drafts[:, :, None], 1.0),
                            draft_probs)
            linear = verify(p, q, drafts, num, u[:, :k_max], u.gather(1, num[:, None]).squeeze(1))
            chain = torch.arange(k_max, device=drafts.device).expand(bsz, k_max)
            tree = TreeResult(torch.where(one_hot[:, None], tree.path, chain),
                              torch.where(one_hot, tree.accepted, torch.as_tensor(linear.num_accepted)),
                              torch.where(one_hot, tree.final, torch.as_tensor(linear.final_token)))
    return torch.cat([drafts, tree.accepted[:, None], tree.final[:, None], tree.path], dim=1)
