"""Prompt prefixes already in the KV cache, so a request that repeats one skips its prefill.

Chat apps resend the whole history every turn and agents resend the same files: the first
prompt blocks of a new request are often the first blocks of an earlier one. A request's blocks
keep their keys and values after it finishes, until the pool hands them out again; this index
remembers which blocks hold which prompt prefix. A new request takes a cached block where it
lies when it is free, and gets a copy of it when its request still runs (a memory copy instead
of a forward). Blocks are never shared between running requests: every block has one writer, so
a request's draft catch-up or decoding can never touch another's rows.

Granularity is the KV block (the scheduler builds this index with ``chunk`` = the block size):
the forward computes a prompt block by block, each block's rows attending to the keys up to the
block's end (``attention_plans.plan_segments``), so the rows of every *full* prompt block are exactly the
rows a recompute would produce, bit for bit on the CPU, however either prompt was chunked, and a
request that reuses them gets the logits it would get without the cache. (A partial block would
not do: measured here, an attention call's rows change in the last bits with the rows computed
beside them.) Where every row attends on its own (``ModelRunner.rows_alone``, the CPU's row
kernel), the rows the decoding wrote are those a prefill of the same tokens computes, so a
request's output blocks are recorded too (``tokens`` = prompt and output): the next turn of a
chat, which re-sends the answer, finds it cached.

A unit is keyed by a hash chain over the prompt up to its end (vLLM's block hashes), so one
lookup per unit finds the longest cached prefix. A request's ``cache_salt`` (vLLM's extension)
starts its chain: requests share cached blocks only when their salts are equal (or both absent),
so a tenant with its own secret salt cannot learn from its time to first token whether another
tenant sent a prompt, and a benchmark can give each of its arms a cache of its own. The draft
model's rows of a unit live in the same blocks of its own pool; they count only once the
holder's draft has computed them (``ChunkHit.draft``).
"""

from __future__ import annotations

import hashlib
from array import array
from dataclasses import dataclass
from typing import Callable, Iterable


@dataclass(frozen=True)
class ChunkHit:
    """Prompt chunk ``i`` of a lookup is cached in ``blocks``; ``draft``: the draft model's rows
    of it are there too."""

    blocks: tuple[int, ...]
    draft: bool


class PrefixCache:
    """Which blocks hold which full prompt units of ``chunk`` tokens (one owner: the scheduler)."""

    def __init__(self, chunk: int, block_size: int) -> None:
        if chunk % block_size:
            raise ValueError(f"prefill chunk {chunk} is not a multiple of the block size {block_size}")
        self.chunk = chunk
        self.blocks_per_chunk = chunk // block_size
        self._holders: dict[bytes, dict[tuple[int, ...], bool]] = {}
        self._chunk_of: dict[int, tuple[bytes, tuple[int, ...]]] = {}

    def chunk_keys(self, tokens: list[int], limit: int, salt: str | None = None,
                   keys: list[bytes] | None = None) -> list[bytes]:
        """The hash chain of the full chunks of ``tokens[:limit]``: key i names chunks 0..i
        (and the salt, when there is one). ``keys``: the chain of earlier calls over the same
        tokens (a request's), extended in place, so that each chunk is hashed once however often
        its request is looked up or recorded."""
        keys = [] if keys is None else keys
        previous = keys[-1] if keys else (
            b"" if salt is None else hashlib.blake2b(salt.encode(), digest_size=16, person=b"cache_salt").digest())
        for end in range(self.chunk * (len(keys) + 1), limit + 1, self.chunk):
            digest = hashlib.blake2b(previous, digest_size=16)
            digest.update(array("q", tokens[end - self.chunk:end]).tobytes())
            previous = digest.digest()
            keys.append(previous)
        return keys[:limit // self.chunk]

    def lookup(self, prompt: list[int], is_free: Callable[[int], bool], salt: str | None = None,
               keys: list[bytes] | None = None) -> list[ChunkHit]:
        """The longest cached prefix that leaves at least one prompt token to compute (its
        logits start the answer), chunk by chunk; among holders of a chunk, one whose blocks are
        free (taken where they lie: no copy), then one with the draft's rows."""
        hits: list[ChunkHit] = []
        for key in self.chunk_keys(prompt, len(prompt) - 1, salt, keys):
            holders = self._holders.get(key)
            if not holders:
                break
            best = max(holders.items(), key=lambda h: (all(is_free(b) for b in h[0]), h[1]))
            hits.append(ChunkHit(*best))
        return hits

    def record(self, blocks: list[int], tokens: list[int], computed: int, draft_computed: int,
               recorded: tuple[int, int], salt: str | None = None, keys: list[bytes] | None = None) -> tuple[int, int]:
        """A request with table ``blocks`` has ``computed`` target and ``draft_computed`` draft
        positions of ``tokens`` (its prompt, or its prompt and output where decoded rows are
        shared) in the cache: register the full chunks among them. ``recorded`` is what was
        registered before (target and draft chunks); returns the new count. ``keys``: the
        request's chain so far (``chunk_keys``), extended in place."""
        full = min(computed, len(tokens)) // self.chunk
        drafted = min(draft_computed, full * self.chunk) // self.chunk
        if (full, drafted) == recorded:
            return recorded
        per = self.blocks_per_chunk
        keys = self.chunk_keys(tokens, full * self.chunk, salt, keys)
        for i in range(min(recorded), full):  # the chunks before were registered, with their draft rows
            key = keys[i]
            holder = tuple(blocks[i * per:(i + 1) * per])
            if i >= recorded[0] or (recorded[1] <= i < drafted):
                self._holders.setdefault(key, {})[holder] = i < drafted
                for b in holder:
                    self._chunk_of[b] = (key, holder)
        return full, drafted

    def holds(self, block: int) -> bool:
        """Whether ``block`` holds a cached chunk (the pool parks it when it is freed)."""
        return block in self._chunk_of

    def forget(self, blocks: Iterable[int]) -> None:
        """These blocks are about to be overwritten: the chunks they held are gone from them."""
        for b in blocks:
            entry = self._chunk_of.get(b)
            if entry is None:
                continue
            key, holder = entry
            for other in holder:
                self._chunk_of.pop(other, None)
            holders = self._holders.get(key)
            if holders is not None:
                holders.pop(holder, None)
                if not holders:
                    del self._holders[key]
