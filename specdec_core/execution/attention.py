"""Attention over the requests' own cached keys, in the two layouts a forward can take.

- **Segments** (the CPU default): one call per *attention segment*: the known tokens a request
  feeds in a step (its last token, or a prompt chunk) form one segment per KV block they fall in
  (so a prompt block's rows never depend on how the prompt was chunked), or one per row where
  ``RowAttention`` runs (so a prompt's rows are also those decoding gives the same tokens), and
  every draft token a segment of its own, each reading exactly its request's keys
  ``[0, position]`` (a slice of the cache where the request's blocks are consecutive, else rows
  gathered once per request and layer: the same values in the same shapes either way). A
  segment's shapes depend only on its own request, never on the batch, and a draft token is
  scored by exactly the call that would score it if it were decoded alone later: rows are
  bit-identical alone and batched, and verifying k drafts gives the logits k plain decode steps
  would give.
  (Measured here: a CPU matmul's row changes in the last bits with the number of rows it is
  computed with, so a call shared by rows of several requests could not promise that.)
  Where the C kernels run (float32 on an AVX2 CPU), every one-row segment (a decode row, a
  draft, a prompt row) goes to one call per layer instead (``RowAttention``,
  ``kernels/csrc/row_attention.c``), which computes each row's heads on their own: a torch call per row
  costs 80-165 us here, nearly all of it per-op overhead, 28 of them per row in a step of the
  1.5B. A prompt of 128-2048 tokens prefilled row by row took 0.98-1.01x the time of block
  segments on the default pair.
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

from specdec_core.kernels import c_library


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
    mask: torch.Tensor | None  # causal mask [q_len, kv_len - lo] for multi-row segments
    gather: torch.Tensor | None = None  # [>= kv_len] cache rows of the request's positions
    group: int = -1
    lo: int = 0  # the first position attended (a sliding window's start; 0: every key up to the row)

    def windowed(self, window: int) -> Segment:
        """This segment on a sliding-window layer: a row at position p attends keys
        ``p - window + 1 .. p`` (transformers' sliding-window mask), so the keys start at the
        first row's window and the mask also cuts each row's window."""
        first = self.kv_len - self.q_len
        lo = max(0, first - window + 1)
        if lo == 0 and self.kv_len <= window:
            return self
        mask = None
        if self.q_len > 1:
            q_pos = torch.arange(first, self.kv_len)[:, None]
            k_pos = torch.arange(lo, self.kv_len)[None, :]
            mask = ((k_pos <= q_pos) & (k_pos > q_pos - window)).to(self.mask.device if self.mask is not None else "cpu")
        return Segment(self.row, self.q_len, self.base, self.kv_len, mask, self.gather, self.group, lo)


@dataclass
class RowAttention:
    """The one-row segments of a forward, built once per forward and attended by one C call per
    layer: query row, number of keys, and where the keys are (cache rows ``base ..`` where
    ``first`` is -1, else ``index[first ..]``)."""

    rows: torch.Tensor  # int64 [R]
    kv_len: torch.Tensor
    base: torch.Tensor
    first: torch.Tensor
    index: torch.Tensor  # the gathered requests' cache rows, one after another

    def __post_init__(self) -> None:
        # the kernel's index arguments, read once per forward rather than once per layer
        self.pointers = (self.rows.data_ptr(), self.kv_len.data_ptr(), self.base.data_ptr(), self.first.data_ptr(),
                         self.index.data_ptr(), self.rows.numel())

    def windowed(self, window: int) -> RowAttention:
        """The same rows on a sliding-window layer: each attends its last ``window`` keys, whose
        cache rows start ``kv_len - window`` further (in the run of blocks, or in the gathered
        list), so the kernel is the same call over fewer keys."""
        skip = (self.kv_len - window).clamp(min=0)
        gathered = self.first >= 0
        return RowAttention(self.rows, self.kv_len - skip, torch.where(gathered, self.base, self.base + skip),
                            torch.where(gathered, self.first + skip, self.first), self.index)


def split_single_rows(segments: list[Segment]) -> tuple[list[Segment], RowAttention | None]:
    """The multi-row segments, and the one-row ones as a ``RowAttention`` (None if there are none)."""
    multi = [s for s in segments if s.q_len > 1]
    single = [s for s in segments if s.q_len == 1]
    if not single:
        return multi, None
    offsets: dict[int, int] = {}
    gathers: list[torch.Tensor] = []
    gathered = 0  # the rows of ``gathers`` so far (summing them again per group made this quadratic)
    for s in single:
        if s.gather is not None and s.group not in offsets:
            offsets[s.group] = gathered
            gathers.append(s.gather)
            gathered += len(s.gather)
    rows, kv_len, base, first = torch.tensor(
        [[s.row, s.kv_len, s.base, offsets.get(s.group, -1) if s.gather is not None else -1] for s in single],
        dtype=torch.int64).T.contiguous()
    index = torch.cat(gathers) if gathers else torch.zeros(1, dtype=torch.int64)
    return multi, RowAttention(rows, kv_len, base, first, index.contiguous())


def attend_rows(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, rows: RowAttention, out: torch.Tensor,
                scale: float | None = None) -> None:
    """``out[row] = attention of q[:, row]`` for every row of ``rows`` (``q`` ``[H, T, D]`` a
    transposed view of ``[T, H, D]``, ``out`` ``[T, H, D]``, the cache ``[kv_heads, rows, D]``);
    ``scale`` multiplies the scores (None: ``head_dim ** -0.5``)."""
    heads, _, head_dim = q.shape
    if q.stride(0) != head_dim or q.stride(2) != 1 or keys.stride(1) != head_dim or not out.is_contiguous():
        raise ValueError("attend_rows wants [T, H, D] queries and a [kv_heads, rows, D] cache")
    rc = c_library.library().sd_attend_rows(
        q.data_ptr(), q.stride(1), keys.data_ptr(), values.data_ptr(), keys.stride(0), *rows.pointers,
        heads, keys.shape[0], head_dim, head_dim ** -0.5 if scale is None else scale,
        out.data_ptr(), out.stride(0), torch.get_num_threads())
    if rc != 0:
        raise ValueError(f"the row attention kernel refused {heads} heads over {keys.shape[0]} of dim {head_dim}")


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
    q_pos: torch.Tensor | None = None  # [groups * q_max] each padded query's position

    def windowed(self, window: int) -> PackedAttention:
        """The same call on a sliding-window layer: the mask also hides keys more than
        ``window - 1`` positions before the query (device ops only, so a captured graph holds it)."""
        if self.q_pos is None:
            raise ValueError("a windowed packed layout needs the queries' positions")
        key_pos = torch.arange(self.kv_max, device=self.q_pos.device)
        near = key_pos[None, None, :] > self.q_pos.view(self.groups, self.q_max, 1) - window
        return PackedAttention(self.q_gather, self.k_gather, self.mask & near[:, None], self.out_rows, self.groups,
                               self.q_max, self.kv_max, self.q_pos)


def packed_attention(q_gather: torch.Tensor, q_pos: torch.Tensor, k_gather: torch.Tensor, out_rows: torch.Tensor,
                     groups: int, q_max: int, kv_max: int) -> PackedAttention:
    """The packed layout from its planned indices; ``q_pos`` ``[groups * q_max]`` is each padded
    query's position, so a query sees its own request's keys at positions up to its own."""
    key_pos = torch.arange(kv_max, device=q_pos.device)
    mask = key_pos[None, None, :] <= q_pos.view(groups, q_max, 1)
    return PackedAttention(q_gather, k_gather, mask[:, None], out_rows, groups, q_max, kv_max, q_pos)


def attend_segments(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, segments: list[Segment],
                    rows: RowAttention | None = None, scale: float | None = None) -> torch.Tensor:
    """``q`` ``[H, T, D]``; ``keys``/``values`` a layer's cache ``[kv_heads, rows, D]``; returns
    ``[T, H, D]``. ``rows``: one-row segments left out of ``segments`` (``split_single_rows``);
    ``scale``: of the scores (None: ``head_dim ** -0.5``)."""
    heads, tokens, head_dim = q.shape
    out = q.new_empty(tokens, heads, head_dim)
    if rows is not None:
        attend_rows(q, keys, values, rows, out, scale)
    gathered: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for s in segments:
        if s.gather is None:
            k, v = keys[:, s.base + s.lo:s.base + s.kv_len], values[:, s.base + s.lo:s.base + s.kv_len]
        else:
            if s.group not in gathered:
                gathered[s.group] = keys.index_select(1, s.gather), values.index_select(1, s.gather)
            k, v = (t[:, s.lo:s.kv_len] for t in gathered[s.group])
        o = F.scaled_dot_product_attention(
            q[None, :, s.row:s.row + s.q_len], k[None], v[None],
            attn_mask=s.mask, enable_gqa=heads != keys.shape[0], scale=scale)
        out[s.row:s.row + s.q_len] = o[0].transpose(0, 1)
    return out


def attend_packed(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, p: PackedAttention,
                  scale: float | None = None) -> torch.Tensor:
    """The same result as ``attend_segments`` (up to rounding) in one attention call."""
    heads, _, head_dim = q.shape
    kv_heads = keys.shape[0]
    qp = q.index_select(1, p.q_gather).view(heads, p.groups, p.q_max, head_dim).transpose(0, 1)
    kp = keys.index_select(1, p.k_gather).view(kv_heads, p.groups, p.kv_max, head_dim).transpose(0, 1)
    vp = values.index_select(1, p.k_gather).view(kv_heads, p.groups, p.kv_max, head_dim).transpose(0, 1)
    o = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=p.mask, enable_gqa=heads != kv_heads, scale=scale)
    return o.transpose(1, 2).reshape(p.groups * p.q_max, heads, head_dim).index_select(0, p.out_rows)
