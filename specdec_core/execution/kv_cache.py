"""Paged KV storage: one pool of fixed-size blocks per model, handed out through block tables.

A request owns a *block table*, the list of blocks holding its positions in order (position p
lives in row ``table[p // block_size] * block_size + p % block_size`` of every layer's cache).
Blocks are allocated as a request grows, so a few long requests and many short ones share one
pool sized from memory, not ``max_num_seqs x max_model_len``. Rolling back rejected draft tokens
is still only a matter of lowering the request's length: rows past it are masked out and later
overwritten. The target's and the draft's pools have the same number of blocks and a request
uses the same table in both (position p is in the same block of each).

Attention reads a request's keys as one run of rows. Where its table is one run of consecutive
blocks (the allocator, ``engine/block_pool``, tries hard) that is a free slice; otherwise the rows are
gathered, once per request and layer. Either way the attention call sees the same values in the
same shapes, so a row's result does not depend on where its blocks are (checked bit for bit).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from transformers.cache_utils import Cache

from specdec_core.execution.hf_types import HFModule


@dataclass
class PackedLayout:
    """Where the tokens of one packed forward go, and which cached entries they attend to.

    Indices are flat rows into a layer's cache viewed as ``[heads, num_blocks * block_size,
    head_dim]``, so writing and reading are single ``index_copy_`` / ``index_select`` kernels.
    ``key_range`` is set when the keys form one contiguous run (a batch of one request whose
    blocks are consecutive): then reading is a free slice.
    """

    tok_index: torch.Tensor
    key_index: torch.Tensor
    key_range: tuple[int, int] | None = None


def token_rows(blocks: Sequence[int], block_size: int, start: int, stop: int) -> list[int]:
    """The flat cache rows of positions ``start .. stop - 1`` of a request with table ``blocks``."""
    rows: list[int] = []
    p = start
    while p < stop:
        offset = p % block_size
        end = min(stop, p - offset + block_size)
        base = blocks[p // block_size] * block_size + offset
        rows.extend(range(base, base + end - p))
        p = end
    return rows


def contiguous_base(blocks: Sequence[int], block_size: int, length: int) -> int | None:
    """The first row of positions ``0 .. length - 1`` when they are one run of rows, else None."""
    if length <= 0:
        return None
    n = math.ceil(length / block_size)
    first = blocks[0]
    if list(blocks[:n]) != list(range(first, first + n)):  # compared in C: long tables are checked every forward
        return None
    return first * block_size


def blocks_for(tokens: int, block_size: int) -> int:
    return math.ceil(tokens / block_size)


def region(i: int, length: int, block_size: int) -> list[int]:
    """The block table of the ``i``-th of equal runs of blocks holding ``length`` positions each:
    how benchmarks and tests that place requests by hand (no scheduler) address a pool of
    ``n * blocks_for(length, block_size)`` blocks."""
    per = blocks_for(length, block_size)
    return list(range(i * per, (i + 1) * per))


def kv_bytes_per_token(model: HFModule) -> int:
    """Bytes one position takes in a model's cache (keys and values of every layer), in the
    model's own dtype, which is the cache's (``ModelRunner``)."""
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    itemsize = next(model.parameters()).element_size()
    return 2 * cfg.num_hidden_layers * kv_heads * head_dim * itemsize


def zeroed(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zero tensor whose pages the OS hands out on first touch (CPU), 64-byte aligned.

    ``torch.zeros`` writes every byte up front: 2.3 s and the whole pool resident at start-up for
    a 5.5 GiB pool, though a server touches only the blocks its requests use. numpy's zeros come
    from ``calloc``, which for a pool this size maps fresh zero pages and writes nothing."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    itemsize = torch.empty((), dtype=dtype).element_size()
    count = math.prod(shape)
    raw = np.zeros(count * itemsize + 64, dtype=np.uint8)
    skip = -raw.ctypes.data % 64
    return torch.from_numpy(raw[skip:skip + count * itemsize]).view(dtype).view(shape)


class PagedKVCache(Cache):
    """KV storage of one model: ``[kv_heads, (num_blocks + 1) * block_size, head_dim]`` per layer.

    Heads first, so both the rows written and the rows read back are ``[heads, tokens, dim]``
    blocks that attention consumes without a transposing copy (several times faster on CPU).
    The last block is no request's: padding tokens of a bucketed forward (``decode_graphs``)
    write their keys there (``scratch_row``) and read only those.
    """

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        super().__init__(layers=[])
        shape = (num_kv_heads, (num_blocks + 1) * block_size, head_dim)
        self.keys = [zeroed(shape, dtype, device) for _ in range(num_layers)]
        self.values = [zeroed(shape, dtype, device) for _ in range(num_layers)]
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.device = device
        self.layout: PackedLayout | None = None
        self.scratch_row = num_blocks * block_size

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)

    def update(  # type: ignore[override]
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new tokens' K/V at their rows; return the batch's packed prefixes."""
        lay = self.layout
        if lay is None:
            raise RuntimeError("PagedKVCache used outside ModelRunner.forward")
        out = []
        for cache, states in ((self.keys[layer_idx], key_states), (self.values[layer_idx], value_states)):
            cache.index_copy_(1, lay.tok_index, states[0].to(cache.dtype))  # states: [1, heads, tokens, dim]
            if lay.key_range is not None:
                rows = cache[:, lay.key_range[0]:lay.key_range[1]]
            else:
                rows = cache.index_select(1, lay.key_index)
            out.append(rows.unsqueeze(0))
        return out[0], out[1]

    @torch.inference_mode()
    def copy_blocks(self, src: Sequence[int], dst: Sequence[int]) -> None:
        """Copy whole blocks ``src[i]`` into ``dst[i]`` (a cached prompt prefix handed to another
        request): a memory copy instead of a forward."""
        if src:
            self.copy_rows(token_rows(src, self.block_size, 0, len(src) * self.block_size),
                           token_rows(dst, self.block_size, 0, len(dst) * self.block_size))

    def copy_rows(self, src: Sequence[int], dst: Sequence[int]) -> None:
        """Copy flat cache rows ``src[i]`` into ``dst[i]`` in every layer (every source is read
        before any row is written, so the two may overlap)."""
        src_rows = torch.tensor(src, device=self.device)
        dst_rows = torch.tensor(dst, device=self.device)
        for cache in (*self.keys, *self.values):
            cache.index_copy_(1, dst_rows, cache.index_select(1, src_rows))

    def get_seq_length(self, layer_idx: int = 0) -> int:  # type: ignore[override]
        # Positions are always passed explicitly; this is only consulted when they are not.
        return 0
