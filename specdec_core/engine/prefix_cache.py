"""Prompt prefixes already in the KV cache, so a request that repeats one skips its prefill.

Chat apps resend the whole history every turn and agents resend the same files: the first
prompt chunks of a new request are often the first chunks of an earlier one. A request's cache
slot keeps its keys and values after it finishes, until the slot is given to another request;
this index remembers which slot holds which prefix and hands it out (the slot itself when it is
free, else a copy of its rows: a memory copy instead of a forward).

Granularity is the prefill chunk (``prefill_chunk_size``): prompts are prefilled in chunks at
fixed offsets (0, C, 2C, ...), and a chunk's keys and values depend only on the tokens up to its
end. So the rows of every *full* prompt chunk are exactly the rows a recompute would produce, bit
for bit on the CPU, and a request that reuses them and prefills the rest in the same chunks gets
the logits it would get without the cache. (A partial chunk would not do: measured here, an
attention call's rows change in the last bits with the rows computed beside them.) Rows the
decoding wrote are never shared, for the same reason.

A prefix is keyed by a hash chain over its chunks (vLLM's block hashes, at chunk size), so one
lookup per chunk finds the longest cached prefix.
"""

from __future__ import annotations

import hashlib
from array import array
from dataclasses import dataclass


@dataclass(frozen=True)
class PrefixHit:
    """``length`` tokens of the prompt are cached in ``slot``."""

    slot: int
    length: int


class PrefixCache:
    """Which slot holds which full prompt chunks (one owner: the scheduler)."""

    def __init__(self, chunk: int) -> None:
        self.chunk = chunk
        self._slots_by_key: dict[bytes, set[int]] = {}
        self._keys_by_slot: dict[int, list[bytes]] = {}

    def chunk_keys(self, tokens: list[int], limit: int) -> list[bytes]:
        """The hash chain of the full chunks of ``tokens[:limit]``: key i names chunks 0..i."""
        keys: list[bytes] = []
        previous = b""
        for end in range(self.chunk, limit + 1, self.chunk):
            digest = hashlib.blake2b(previous, digest_size=16)
            digest.update(array("q", tokens[end - self.chunk:end]).tobytes())
            previous = digest.digest()
            keys.append(previous)
        return keys

    def lookup(self, prompt: list[int], prefer: set[int]) -> PrefixHit | None:
        """The longest cached prefix that leaves at least one prompt token to compute (its
        logits start the answer); among slots holding it, one in ``prefer`` (free slots: no copy)."""
        keys = self.chunk_keys(prompt, len(prompt) - 1)
        for i in range(len(keys) - 1, -1, -1):
            slots = self._slots_by_key.get(keys[i])
            if slots:
                best = min(slots & prefer) if slots & prefer else min(slots)
                return PrefixHit(best, (i + 1) * self.chunk)
        return None

    def record(self, slot: int, prompt: list[int], computed: int) -> None:
        """The slot's request has ``computed`` tokens in the cache: its full prompt chunks among
        them are shareable."""
        known = self._keys_by_slot.setdefault(slot, [])
        limit = min(computed, len(prompt))
        if limit // self.chunk <= len(known):
            return
        for key in self.chunk_keys(prompt, limit)[len(known):]:
            known.append(key)
            self._slots_by_key.setdefault(key, set()).add(slot)

    def keep_only(self, slot: int, length: int) -> None:
        """The slot is reused: its first ``length`` tokens stay (a reused prefix), the rest is
        about to be overwritten."""
        known = self._keys_by_slot.get(slot, [])
        for key in known[length // self.chunk:]:
            holders = self._slots_by_key[key]
            holders.discard(slot)
            if not holders:
                del self._slots_by_key[key]
        del known[length // self.chunk:]
