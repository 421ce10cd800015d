"""How a native forward's attention is laid out: the host plans of the two layouts
(``attention``'s segments and packed groups), and the ``Batch`` the decoder runs from a plan.

Why apart from the runner: these are the index computations of the layouts (which rows attend
to which cache rows), the part of a forward that decides whether rows are bit-identical alone and
batched; the runner only picks one by its ``DeviceProfile`` and runs it.
"""

from __future__ import annotations

import torch

from specdec_core.execution.attention import Segment, packed_attention, split_single_rows
from specdec_core.execution.decode_graphs import Bucket, DecodeGraphs, kv_bucket
from specdec_core.execution.forward_plan import ForwardItem, ForwardPlan, token_lists, token_refs
from specdec_core.execution.host_upload import HostUpload, Ref
from specdec_core.execution.kv_cache import PagedKVCache, contiguous_base, token_rows
from specdec_core.execution.native_decoder import Batch


def plan_segments(items: list[ForwardItem], upload: HostUpload, block_size: int, rows_alone: bool) -> ForwardPlan:
    """Where the row kernel runs (``rows_alone``), every row is a segment of its own over
    its keys up to it. Elsewhere a request's known tokens are cut into attention segments at
    absolute block boundaries (a block's rows over the keys up to the block's end), and every
    draft is a segment of its own. Either way a draft is scored by exactly the call that
    would score it if it were decoded alone, and a full block of a prompt gets the same rows
    however the prompt was chunked or how much of it came from the prefix cache (which can so
    reuse any full block); with rows alone, also the rows decoding gives the same tokens
    (measured on the default pair: prefill 0.98-1.01x the time of block segments at
    128-2048 tokens). A request whose blocks are not one run gets its rows gathered (once
    per layer)."""
    plan = ForwardPlan(*token_refs(items, block_size, upload))
    segments: list[tuple[int, int, int, int, int]] = []
    gathers: list[Ref] = []
    row, bs = 0, block_size
    for it in items:
        end = it.start + len(it.tokens)
        base, group = contiguous_base(it.blocks, bs, end), -1
        if base is None:
            base, group = 0, len(gathers)
            gathers.append(upload.ints(token_rows(it.blocks, bs, 0, end)))
        known_end = end - it.num_drafts
        pos = it.start
        while pos < known_end:
            stop = pos + 1 if rows_alone else min(known_end, (pos // bs + 1) * bs)
            segments.append((row + pos - it.start, stop - pos, base, stop, group))
            pos = stop
        row += known_end - it.start
        if it.draft_paths is None:
            segments += [(row + j, 1, base, known_end + j + 1, group) for j in range(it.num_drafts)]
        else:  # a tree node's keys: the known tokens', then its ancestors' and its own
            segments += _tree_segments(it, row, known_end, gathers, upload, bs)
        row += it.num_drafts
    plan.segments, plan.gathers = segments, gathers
    return plan

def _tree_segments(it: ForwardItem, row: int, known_end: int, gathers: list[Ref], upload: HostUpload,
                   bs: int) -> list[tuple[int, int, int, int, int]]:
    """One segment per node of a token tree, over the known tokens' keys and its path's. A
    node's path is a prefix of the path down its first children to a leaf, so one key list per
    leaf serves every node above it, as one list serves a chain."""
    known = token_rows(it.blocks, bs, 0, known_end)
    slots = token_rows(it.blocks, bs, known_end, known_end + it.num_drafts)
    paths = it.draft_paths or []
    first_child: dict[int, int] = {}
    for j, path in enumerate(paths):
        first_child.setdefault(path[-2] if len(path) > 1 else -1, j)
    leaf_lists: dict[int, int] = {}
    segments = []
    for j, path in enumerate(paths):
        leaf = j
        while leaf in first_child:
            leaf = first_child[leaf]
        if leaf not in leaf_lists:
            leaf_lists[leaf] = len(gathers)
            gathers.append(upload.ints(known + [slots[a] for a in paths[leaf]]))
        segments.append((row + j, 1, 0, known_end + len(path), leaf_lists[leaf]))
    return segments


def plan_packed(items: list[ForwardItem], upload: HostUpload, cache: PagedKVCache, max_len: int,
                graphs: DecodeGraphs | None) -> ForwardPlan:
    """One attention call per layer: every request is a group of up to ``q_max`` rows over
    ``kv_max`` keys gathered from its own (``kv_bucket``: a power of two, so that a padded
    and an eager forward make the same call), under a causal mask (a draft row at position
    p sees keys 0..p, as when decoded alone). Padding rows see key 0 and are never read back.
    Where the forward fits a bucket of ``decode_graphs``, its groups and tokens are padded
    to the bucket's and its indices uploaded in the bucket's static-buffer order."""
    bs = cache.block_size
    q_max = max(len(it.tokens) for it in items)
    kv_max = kv_bucket(max(it.start + len(it.tokens) for it in items), bs, max_len)
    bucket = graphs.bucket(len(items), q_max, kv_max) if graphs is not None else None
    shape = bucket or Bucket(len(items), q_max, kv_max)
    q = shape.q  # query slots per request: a bucket may give more than q_max
    lists = token_lists(items, bs)
    q_gather: list[int] = []
    q_pos: list[int] = []
    k_gather: list[int] = []
    out_rows: list[int] = []
    spare: list[int] = []  # query slots no real token reads (padding tokens do, when bucketed)
    row = 0
    for g, it in enumerate(items):
        n = len(it.tokens)
        keys = token_rows(it.blocks, bs, 0, it.start + n)
        q_gather += [row + min(i, n - 1) for i in range(q)]
        q_pos += [it.start + i if i < n else 0 for i in range(q)]
        k_gather += keys + [keys[0]] * (kv_max - len(keys))  # padding keys are masked out
        out_rows += range(g * q, g * q + n)
        spare += range(g * q + n, (g + 1) * q)
        row += n
    num_logits = len(lists["logit_rows"])
    refs = {"ids": upload.ints(lists["ids"]), "logit_rows": upload.ints(lists["logit_rows"])}
    plan = ForwardPlan(refs, num_logits, packed_shape=shape, bucketed=bucket is not None)
    if bucket is None:
        refs.update(pos=upload.ints(lists["pos"]), write=upload.ints(lists["write"]), q_gather=upload.ints(q_gather),
                    q_pos=upload.ints(q_pos), k_gather=upload.ints(k_gather), out_rows=upload.ints(out_rows))
        return plan
    # Padding: tokens at position 0 writing to the scratch block; groups over scratch keys.
    scratch, pad, extra = cache.scratch_row, bucket.tokens - row, bucket.groups - len(items)
    spare += range(len(items) * q, bucket.tokens)
    refs["index"] = upload.ints(
        lists["pos"] + [0] * pad + lists["write"] + [scratch] * pad + q_gather + [0] * (extra * q)
        + q_pos + [0] * (extra * q) + k_gather + [scratch] * (extra * kv_max) + out_rows + spare)
    return plan


def native_batch(plan: ForwardPlan, upload: HostUpload, ids: torch.Tensor, row_attention: bool) -> Batch:
    """The decoder's view of a planned forward, its indices on the device."""
    r = plan.refs
    batch = Batch(ids, upload[r["pos"]], upload[r["write"]], upload[r["logit_rows"]])
    if plan.packed_shape is not None:
        shape = plan.packed_shape
        batch.packed = packed_attention(upload[r["q_gather"]], upload[r["q_pos"]], upload[r["k_gather"]],
                                        upload[r["out_rows"]], shape.groups, shape.q, shape.kv)
        return batch
    gathers = [upload[ref] for ref in plan.gathers or []]
    batch.segments = [Segment(row, q_len, base, kv_len, _causal(q_len, kv_len, ids.device),
                              gathers[group] if group >= 0 else None, group)
                      for row, q_len, base, kv_len, group in plan.segments or []]
    if row_attention:
        batch.segments, batch.rows = split_single_rows(batch.segments)
    return batch


def _causal(q_len: int, kv_len: int, device: torch.device) -> torch.Tensor | None:
    if q_len == 1:
        return None
    q_pos = torch.arange(kv_len - q_len, kv_len, device=device)
    return torch.arange(kv_len, device=device)[None, :] <= q_pos[:, None]
