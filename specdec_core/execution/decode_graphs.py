"""Decode and verify forwards in bucketed static shapes, captured as CUDA graphs per bucket.

Why: on a GPU a decode step is bound by kernel launches, not arithmetic: the 1.5B target's
forward is ~1,000 launches for ~1 ms of weight reads. A CUDA graph replays a captured forward's
kernels with one launch, but only with the shapes and tensor addresses it was captured with. So a
forward in which every request feeds at most ``max_q`` tokens (decode, verification, each draft
position) is laid out in a *bucket*: its requests padded to a batch size from ``batch_buckets``,
every request's keys to a power of two (``kv_bucket``; the eager packed layout uses the same, so
both run the same attention shapes), its tokens to ``groups x q``. Padding tokens write their keys
to the cache's scratch block and attend only to it. The forward's indices are copied into the
bucket's static buffers (one copy: the planner lays them out in the buffer's order) and the
bucket's graph, captured on first use, is replayed. Prefill chunks stay eager (their shapes vary).

Only the layers are captured (``NativeDecoder.hidden``); the final norm and the head run eagerly
on the rows whose logits are wanted, so a graph's output is a ``[tokens, hidden]`` buffer, not
a vocabulary-wide one, and graphs of all buckets share one memory pool (they are replayed one at
a time).

On the CPU (``decode_graphs="on"``) the same buckets and buffers run eagerly: every real row
equals the eager packed forward's bit for bit (``tests/execution/test_decode_graphs.py``). That is what is
proven without a GPU; capture and replay themselves have not run on one here.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from specdec_core.execution.attention import packed_attention
from specdec_core.execution.kv_cache import PagedKVCache
from specdec_core.execution.native_decoder import Batch, NativeDecoder

log = logging.getLogger("specdec.engine")

MIN_KV_BUCKET = 64
# The index arrays of a bucketed forward, in the order the planner uploads them and the static
# buffer holds them (their lengths: ``Bucket.field_lengths``).
INDEX_FIELDS = ("pos", "write", "q_gather", "q_pos", "k_gather", "out_rows")


def batch_buckets(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then multiples of 8, up to the first that holds ``max_batch`` (vLLM's sizes)."""
    sizes = [1, 2, 4, 8]
    while sizes[-1] < max_batch:
        sizes.append(sizes[-1] + 8)
    return [s for s in sizes if s < max_batch] + [next(s for s in sizes if s >= max_batch)]


def kv_bucket(kv_len: int, block_size: int, max_len: int) -> int:
    """Keys per request in a packed call: the next power of two (at least ``MIN_KV_BUCKET``),
    never more than ``max_len`` rounded up to a block, never less than ``kv_len``."""
    bucket = max(MIN_KV_BUCKET, 1 << max(kv_len - 1, 0).bit_length())
    cap = -(-max_len // block_size) * block_size
    return max(min(bucket, cap), kv_len)


@dataclass(frozen=True)
class Bucket:
    """A forward's static shape: ``groups`` requests of ``q`` query rows over ``kv`` keys each."""

    groups: int
    q: int
    kv: int

    @property
    def tokens(self) -> int:
        return self.groups * self.q

    def field_lengths(self) -> list[int]:
        """Lengths of the ``INDEX_FIELDS``: per token, per query slot (a token's too) or per key."""
        t = self.tokens
        return [t, t, t, t, self.groups * self.kv, t]

    def index_length(self) -> int:
        """Length of the concatenated ``INDEX_FIELDS``."""
        return sum(self.field_lengths())


class _Static:
    """A bucket's input buffers (all padding to begin with: every write goes to the scratch
    block) and, on CUDA, its graph and output."""

    def __init__(self, bucket: Bucket, scratch_row: int, device: torch.device) -> None:
        t = bucket.tokens
        self.ids = torch.zeros(t, dtype=torch.long, device=device)
        self.index = torch.zeros(bucket.index_length(), dtype=torch.long, device=device)
        self.fields = dict(zip(INDEX_FIELDS, self.index.split(bucket.field_lengths())))
        self.fields["write"].fill_(scratch_row)
        self.fields["k_gather"].fill_(scratch_row)
        self.fields["q_gather"].copy_(torch.arange(t, device=device))
        self.fields["out_rows"].copy_(torch.arange(t, device=device))
        self.graph: torch.cuda.CUDAGraph | None = None
        self.hidden: torch.Tensor | None = None


class DecodeGraphs:
    """The bucketed forwards of one model: buckets, static buffers and (on CUDA) their graphs."""

    def __init__(self, native: NativeDecoder, cache: PagedKVCache, max_batch: int, max_q: int, capture: bool) -> None:
        self.native, self.cache = native, cache
        self.batches = batch_buckets(max_batch)
        self.max_q = max_q
        self.capture = capture
        self._static: dict[Bucket, _Static] = {}
        self._pool = torch.cuda.graph_pool_handle() if capture else None

    def bucket(self, groups: int, q_max: int, kv_max: int) -> Bucket | None:
        """The bucket of a forward of ``groups`` requests feeding at most ``q_max`` tokens over
        at most ``kv_max`` keys (already a ``kv_bucket``), or None: it runs eagerly.

        Queries come in two sizes, 1 (decode, a draft position) and ``max_q`` (verification):
        the policy picks 0..k drafts per request and step, and a graph per k would be captured
        while serving. Measured on an H100 (``clients/tools/cuda_check.py``), the default target's
        forward costs the same for 1 to 5 tokens per request, so the padding is nearly free."""
        if q_max > self.max_q or groups > self.batches[-1]:
            return None
        return Bucket(next(b for b in self.batches if b >= groups), 1 if q_max == 1 else self.max_q, kv_max)

    def capture_all(self, kv_limit: int, block_size: int, max_len: int) -> int:
        """Capture every bucket whose keys fit ``kv_limit`` now, at start-up, rather than on
        first use while serving (a capture costs tens of ms, and it would land on some
        request's step); longer ones are still captured on first use. Returns how many."""
        if not self.capture:
            return 0
        kvs: list[int] = []
        kv = kv_bucket(1, block_size, max_len)
        while kv <= kv_limit and (not kvs or kv > kvs[-1]):
            kvs.append(kv)
            kv = kv_bucket(kv + 1, block_size, max_len)
        for groups in self.batches:
            for q in sorted({1, self.max_q}):
                for kv in kvs:
                    self._static_for(Bucket(groups, q, kv))
        return len(self._static)

    @property
    def buckets_used(self) -> list[Bucket]:
        """Buckets run so far (each with its static buffers and, on CUDA, its graph)."""
        return list(self._static)

    def run(self, bucket: Bucket, ids: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """Hidden states ``[bucket.tokens, hidden]`` of the real tokens ``ids`` (first) and
        padding; ``index`` holds the planned ``INDEX_FIELDS``, padded, in buffer order."""
        static = self._static_for(bucket)
        real = ids.shape[0]
        static.ids[:real].copy_(ids)
        if real < bucket.tokens:
            static.ids[real:].zero_()
        static.index.copy_(index)
        if static.graph is None:
            return self._body(bucket, static)
        static.graph.replay()
        assert static.hidden is not None
        return static.hidden

    def _static_for(self, bucket: Bucket) -> _Static:
        """The bucket's buffers, made (and on CUDA captured) on first use."""
        static = self._static.get(bucket)
        if static is None:
            static = self._static[bucket] = _Static(bucket, self.cache.scratch_row, self.cache.device)
            if self.capture:  # captured while every buffer is padding: the warm-up writes only scratch
                try:
                    self._capture(bucket, static)
                except RuntimeError as exc:  # a failure costs speed, not the server
                    log.warning("CUDA graph capture failed (%s); decode forwards run eagerly from now on", exc)
                    self.capture, static.graph, static.hidden = False, None, None
        return static

    def _body(self, bucket: Bucket, static: _Static) -> torch.Tensor:
        """The captured work: the layers over the static buffers."""
        f = static.fields
        attention = packed_attention(f["q_gather"], f["q_pos"], f["k_gather"], f["out_rows"],
                                     bucket.groups, bucket.q, bucket.kv)
        return self.native.hidden(Batch(static.ids, f["pos"], f["write"], None, packed=attention), self.cache)

    def _capture(self, bucket: Bucket, static: _Static) -> None:
        """Warm up on a side stream (lazy kernel initialisation must not be captured), then
        capture into the shared pool."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._body(bucket, static)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            static.hidden = self._body(bucket, static)
        static.graph = graph
