"""Lossless verification of token trees of one-hot drafts, vectorised over a step's items.

A node's children are distinct candidates for the same next token. With the target's warped
distribution p at the parent, the children x_1..x_m (in the tree's order) are tried one after
another: x_i is accepted with probability p_i(x_i), where p_i is p with the earlier siblings'
tokens removed and renormalised (the rejection rule with a one-hot q, applied to what is left after
each rejection: SpecInfer's recursive rejection sampling, arXiv 2305.09781, Algorithm 2, with
deterministic drafts). So child i is emitted with probability
``prod_{j<i} (1 - p_j(x_j)) x p_i(x_i) = p(x_i)``. An accepted child continues the walk in its own
row; where every child is rejected, the token is drawn from p with all of them removed (at a leaf,
from p itself: the bonus). Each token is then distributed exactly as the target's own sample.
Greedy is the limit: the child equal to the parent row's argmax is accepted, else the argmax is
emitted.

On a chain (one child per node) this is the linear rule with a one-hot q (``verifier.verify``),
uniform for uniform: node j decides with ``u[j]``, the final token uses ``u[num_drafts]``.
Rows: item b's row 0 scores its last known token, row 1 + j its node j (``VerifyPlan.rows``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec_core.decoding.sampling import sample


@dataclass
class TreeResult:
    """Per item: the accepted path's nodes (``path[b, :accepted[b]]``, root side first), how many,
    and the token that follows them."""

    path: torch.Tensor  # [B, K] node indices, K where unused
    accepted: torch.Tensor  # [B]
    final: torch.Tensor  # [B]


def _walk(chosen: torch.Tensor, parent_row: torch.Tensor) -> torch.Tensor:
    """Nodes on the accepted path: chosen, with every ancestor chosen (parents precede children,
    so one pass in node order settles each node after its parent)."""
    bsz, k = chosen.shape
    on = torch.ones(bsz, k + 1, dtype=torch.bool, device=chosen.device)  # column 0: the root
    for j in range(k):
        on[:, j + 1] = chosen[:, j] & on.gather(1, parent_row[:, j:j + 1]).squeeze(1)
    return on[:, 1:]


def _result(on: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The path's nodes in order, their number, and the row of the last one (0: the root)."""
    k = on.shape[1]
    index = torch.arange(k, device=on.device).expand_as(on)
    path = torch.where(on, index, k).sort(dim=1).values
    stop_row = torch.where(on, index + 1, 0).max(dim=1).values if k else on.new_zeros(on.shape[0], dtype=torch.long)
    return path, on.sum(dim=1), stop_row


def _accept(u: torch.Tensor, px: torch.Tensor, removed: torch.Tensor) -> torch.Tensor:
    """Accept a node with probability p(x) / (1 - removed): p at its token, renormalised after its
    earlier siblings were rejected (written without the division)."""
    return (u * (1 - removed) < px) & (px > 0)


def verify_tree_greedy(target: torch.Tensor, drafts: torch.Tensor, parents: torch.Tensor,
                       num_drafts: torch.Tensor) -> TreeResult:
    """``target`` ``[B, K+1]``: each row's argmax; ``drafts``/``parents`` ``[B, K]`` (parent -1:
    the root; nodes j >= num_drafts[b] are padding)."""
    k = drafts.shape[1]
    valid = torch.arange(k, device=drafts.device)[None, :] < num_drafts[:, None]
    parent_row = parents + 1
    on = _walk((drafts == target.gather(1, parent_row)) & valid, parent_row)
    path, accepted, stop_row = _result(on)
    return TreeResult(path, accepted, target.gather(1, stop_row[:, None]).squeeze(1))


def verify_tree(p: torch.Tensor, drafts: torch.Tensor, parents: torch.Tensor, num_drafts: torch.Tensor,
                u_accept: torch.Tensor, u_final: torch.Tensor) -> TreeResult:
    """``p`` ``[B, K+1, V]`` warped target probabilities by row; ``u_accept`` ``[B, K]`` (node j's
    uniform), ``u_final`` ``[B]``; the rest as ``verify_tree_greedy``."""
    bsz, k = drafts.shape
    dev = p.device
    valid = torch.arange(k, device=dev)[None, :] < num_drafts[:, None]
    parent_row = parents + 1
    px = p[torch.arange(bsz, device=dev)[:, None], parent_row, drafts]  # p at the parent of each node's token
    # sibling[b, j, i]: node i is an earlier sibling of node j
    earlier = torch.arange(k, device=dev)[None, :] < torch.arange(k, device=dev)[:, None]
    sibling = (parents[:, :, None] == parents[:, None, :]) & earlier[None] & valid[:, None, :]
    removed = (sibling * px[:, None, :]).sum(dim=2)  # mass of the earlier siblings' tokens
    accept = _accept(u_accept, px, removed) & valid
    chosen = accept & ~(sibling & accept[:, None, :]).any(dim=2)
    on = _walk(chosen, parent_row)
    path, accepted, stop_row = _result(on)
    p_at = p[torch.arange(bsz, device=dev), stop_row]
    children = ((parent_row == stop_row[:, None]) & valid).to(p.dtype)
    gone = torch.zeros_like(p_at).scatter_add_(1, drafts, children) > 0
    residual = p_at.masked_fill(gone, 0.0)
    # Float round-off can leave no residual mass where p is all on the children: p itself then.
    residual = torch.where(residual.sum(dim=1, keepdim=True) > 0, residual, p_at)
    return TreeResult(path, accepted, sample(residual, u_final))
