"""Attention over the requests' own cached keys, in the two layouts a forward can take.

- **Segments** (the CPU default): one call per *attention segment*: the known tokens a request
  feeds in a step (its last token, or a prompt chunk) form one segment per KV block they fall in
  (so a prompt block's rows never depend on how the prompt was chunked) and every draft token a
  segment of its own, each reading exactly its request's keys ``[0, position]`` (a slice of the
  cache where the request's blocks are consecutive, else rows gathered once per request and
  layer: the same values in the same shapes either way). A segment's
  shapes depend only on its own request, never on the batch, and a draft token is scored by
  exactly the call that would score it if it were decoded alone later: rows are bit-identical
  alone and batched, and verifying k drafts gives the logits k plain decode steps would give.
  (Measured here: a CPU matmul's row changes in the last bits with the number of rows it is
  computed with, so a call shared by rows of several requests could not promise that.)
- **Packed** (the CUDA default): one call per layer for the whole forward. Every request is a
  group of up to ``q_max`` query rows over up to ``kv_max`` of its own keys, gathered through its
  block table, under a causal mask, so a draft row at position p sees keys 0..p as it would alone. On a
  GPU the step is bound by kernel launches, and this is a constant handful per layer whatever
  the batch; rows equal the segmented ones up to rounding (not bit for bit).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class Segment:
    """One attention call: ``q_len`` packed rows from ``row``, at positions
    ``kv_len - q_len .. kv_len - 1`` of a request whose keys start at cache row ``base`` (blocks
    in one run) or, where ``gather`` is set, sit at those cache rows (position order); segments
    of one request share ``group`` and so one gather per layer."""

    row: int
    q_len: int
    base: int
    kv_len: int
    mask: torch.Tensor | None  # causal mask [q_len, kv_len] for multi-row segments
    gather: torch.Tensor | None = None  # [>= kv_len] cache rows of the request's positions
    group: int = -1


@dataclass
class PackedAttention:
    """The layout of one packed call, built once per forward and used by every layer."""

    q_gather: torch.Tensor  # [groups * q_max] row of each padded query (padding repeats a row)
    k_gather: torch.Tensor  # [groups * kv_max] flat cache row of each padded key
    mask: torch.Tensor  # [groups, 1, q_max, kv_max] bool: key position <= query position
    out_rows: torch.Tensor  # [T] padded query index of each real row, in row order
    groups: int
    q_max: int
    kv_max: int


def packed_attention(q_gather: torch.Tensor, q_pos: torch.Tensor, k_gather: torch.Tensor, out_rows: torch.Tensor,
                     groups: int, q_max: int, kv_max: int) -> PackedAttention:
    """The packed layout from its planned indices; ``q_pos`` ``[groups * q_max]`` is each padded
    query's position, so a query sees its own request's keys at positions up to its own."""
    key_pos = torch.arange(kv_max, device=q_pos.device)
    mask = key_pos[None, None, :] <= q_pos.view(groups, q_max, 1)
    return PackedAttention(q_gather, k_gather, mask[:, None], out_rows, groups, q_max, kv_max)


def attend_segments(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, segments: list[Segment]) -> torch.Tensor:
    """``q`` ``[H, T, D]``; ``keys``/``values`` a layer's cache ``[kv_heads, rows, D]``; returns
    ``[T, H, D]``."""
    heads, tokens, head_dim = q.shape
    out = q.new_empty(tokens, heads, head_dim)
    gathered: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for s in segments:
        if s.gather is None:
            k, v = keys[:, s.base:s.base + s.kv_len], values[:, s.base:s.base + s.kv_len]
        else:
            if s.group not in gathered:
                gathered[s.group] = keys.index_select(1, s.gather), values.index_select(1, s.gather)
            k, v = (t[:, :s.kv_len] for t in gathered[s.group])
        o = F.scaled_dot_product_attention(
            q[None, :, s.row:s.row + s.q_len], k[None], v[None],
            attn_mask=s.mask, enable_gqa=heads != keys.shape[0])
        out[s.row:s.row + s.q_len] = o[0].transpose(0, 1)
    return out


def attend_packed(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, p: PackedAttention) -> torch.Tensor:
    """The same result as ``attend_segments`` (up to rounding) in one attention call."""
    heads, _, head_dim = q.shape
    kv_heads = keys.shape[0]
    qp = q.index_select(1, p.q_gather).view(heads, p.groups, p.q_max, head_dim).transpose(0, 1)
    kp = keys.index_select(1, p.k_gather).view(kv_heads, p.groups, p.kv_max, head_dim).transpose(0, 1)
    vp = values.index_select(1, p.k_gather).view(kv_heads, p.groups, p.kv_max, head_dim).transpose(0, 1)
    o = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=p.mask, enable_gqa=heads != kv_heads)
    return o.transpose(1, 2).reshape(p.groups * p.q_max, heads, head_dim).index_select(0, p.out_rows)
