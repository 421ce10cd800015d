"""Preallocated per-request KV regions ("slots") behind the transformers ``Cache`` interface.

Each running request owns one slot: a ``max_model_len`` long region in every layer's key and value
tensors. A forward pass writes each new token's keys/values at its request's own positions and
reads back the regions of the requests in the batch, packed one after another. Rolling back
rejected draft tokens is therefore only a matter of lowering the request's length: entries past it
are masked out and later overwritten. No copy, no recompute.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache


@dataclass
class PackedLayout:
    """Where the tokens of one packed forward go, and which cached entries they attend to.

    Indices are flat row numbers ``slot * max_len + position`` into a layer's cache viewed as
    ``[heads, num_slots * max_len, head_dim]``, so writing and reading are single
    ``index_copy_`` / ``index_select`` kernels. ``key_range`` is set when the keys form one
    contiguous run (a batch of one request): then reading is a free slice.
    """

    tok_index: torch.Tensor
    key_index: torch.Tensor
    key_range: tuple[int, int] | None = None


class SlotAllocator:
    """Hands out cache slots; a finished request's slot is reusable at once.

    Free slots are handed out least recently freed first: a freed slot still holds its request's
    prompt (``PrefixCache``), and the longer it stays unused the less likely that is wanted."""

    def __init__(self, num_slots: int) -> None:
        self.num_slots = num_slots
        self._free = list(range(num_slots))

    def allocate(self, slot: int | None = None) -> int | None:
        """The least recently freed slot, or ``slot`` (which must be free)."""
        if slot is not None:
            self._free.remove(slot)
            return slot
        return self._free.pop(0) if self._free else None

    def free(self, slot: int) -> None:
        if slot in self._free:
            raise RuntimeError(f"slot {slot} freed twice")
        self._free.append(slot)

    @property
    def free_slots(self) -> set[int]:
        return set(self._free)

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_slots - len(self._free)


class SlotKVCache(Cache):
    """KV storage of one model: ``[kv_heads, num_slots * max_len, head_dim]`` per layer.

    Heads first, so both the rows written and the rows read back are ``[heads, tokens, dim]``
    blocks that attention consumes without a transposing copy (several times faster on CPU).
    """

    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        num_kv_heads: int,
        head_dim: int,
        max_len: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        super().__init__(layers=[])
        shape = (num_kv_heads, num_slots * max_len, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.max_len = max_len
        self.layout: PackedLayout | None = None

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)

    def update(  # type: ignore[override]
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new tokens' K/V at their positions; return the batch's packed prefixes."""
        lay = self.layout
        if lay is None:
            raise RuntimeError("SlotKVCache used outside ModelRunner.forward")
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
    def copy_prefix(self, src: int, dst: int, length: int) -> None:
        """Copy the first ``length`` positions of slot ``src`` into slot ``dst`` (a cached prompt
        prefix handed to another request): a memory copy instead of a forward."""
        if length <= 0 or src == dst:
            return
        a, b = src * self.max_len, dst * self.max_len
        for cache in (*self.keys, *self.values):
            cache[:, b:b + length].copy_(cache[:, a:a + length])

    def get_seq_length(self, layer_idx: int = 0) -> int:  # type: ignore[override]
        # Positions are always passed explicitly; this is only consulted when they are not.
        return 0
