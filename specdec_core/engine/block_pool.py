"""Which KV blocks are free, and which to hand out next (one owner: the scheduler).

A request's keys are read as a slice when its blocks are consecutive, and gathered (a copy per
layer and step) when not, so the allocator keeps tables in runs: a request grows into the block
after its last one when that is free, and a new run starts where it leaves the most room (the
middle of the longest free run when a used block ends just before it, so that request can still
grow; among runs of equal length, the lowest).

Free blocks that still hold a cached prompt chunk (the prefix cache's, which the scheduler names
when it frees them) are *parked*: free, and taken where they lie by a request that finds them
cached, but handed out as new blocks only when no other free block is left, the least recently
parked first. Otherwise every new request would start at the front of the pool again and
overwrite the first chunks of the prompt before it: an agent's side request (a title, a
sub-agent) between two turns of a long session made the next turn prefill its whole history again.

Why the free runs are indexed: the pool is sized from memory (thousands of blocks for the default
pair), and scanning every block for the longest run on each new request cost ~0.3 ms a request
in Python; a workload of many short requests spent 14% of its engine time there. The index keeps
each free run's bounds and a heap of runs by length, so a new run's start is found in
O(log runs) and freeing or taking a block touches only its run.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections.abc import Callable, Sequence


class BlockPool:
    """The free blocks as maximal runs ``[start, end)``: ``_starts`` (sorted) and ``_end_of``
    name them; ``_longest`` is a heap of ``(-length, start)`` whose stale entries (runs since
    split or merged) are dropped when they surface."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._num_free = num_blocks
        self._parked: dict[int, None] = {}  # free blocks holding cached chunks, least recently parked first
        self._starts: list[int] = []
        self._end_of: dict[int, int] = {}
        self._start_of: dict[int, int] = {}  # run end -> its start, to merge a freed block on the left
        self._longest: list[tuple[int, int]] = []
        if num_blocks:
            self._add_run(0, num_blocks)

    @property
    def num_free(self) -> int:
        return self._num_free

    @property
    def num_used(self) -> int:
        return self.num_blocks - self._num_free

    def is_free(self, block: int) -> bool:
        return block in self._parked or self._run_of(block) is not None

    def allocate(self, count: int, after: int | None = None) -> list[int]:
        """``count`` free blocks, continuing the run that ends at block ``after`` where possible;
        parked blocks only when the runs are short of ``count`` (see the module docstring)."""
        if count > self._num_free:
            raise RuntimeError(f"{count} blocks asked of a pool with {self._num_free} free")
        short = count - (self._num_free - len(self._parked))
        if short > 0:  # the least recently parked join the runs
            for block in list(itertools.islice(self._parked, short)):
                del self._parked[block]
                self._add_free(block)
        out: list[int] = []
        for _ in range(count):
            block = after + 1 if after is not None and after + 1 in self._end_of else self._run_start()
            self._take(block)
            out.append(block)
            after = block
        return out

    def take(self, blocks: Sequence[int]) -> None:
        """Hand out these free blocks (a cached prefix reused where it lies)."""
        for b in blocks:
            self._take(b)

    def free(self, blocks: Sequence[int], parked: Callable[[int], bool] | None = None) -> None:
        """Give back ``blocks``; those ``parked`` says hold a cached chunk are parked."""
        for b in blocks:
            if not 0 <= b < self.num_blocks or self.is_free(b):
                raise RuntimeError(f"block {b} freed twice")
            if parked is not None and parked(b):
                self._parked[b] = None
            else:
                self._add_free(b)
            self._num_free += 1

    def _add_free(self, b: int) -> None:
        """Block ``b`` joins the free runs (merged with its neighbours)."""
        start, end = b, b + 1
        if end in self._end_of:  # the run after it
            end = self._remove_run(end)
        if b in self._start_of:  # the run before it
            start = self._start_of[b]
            self._remove_run(start)
        self._add_run(start, end)

    def _run_start(self) -> int:
        """Where a new run of blocks should start (see the module docstring)."""
        while self._longest:
            neg_length, start = self._longest[0]
            if self._end_of.get(start) == start - neg_length:
                length = -neg_length
                return start + length // 2 if start > 0 and length > 1 else start
            heapq.heappop(self._longest)
        raise RuntimeError("no free block")

    def _run_of(self, block: int) -> int | None:
        """The start of the free run holding ``block``, or None if it is used."""
        i = bisect.bisect_right(self._starts, block) - 1
        if i >= 0 and block < self._end_of[self._starts[i]]:
            return self._starts[i]
        return None

    def _take(self, block: int) -> None:
        if block in self._parked:
            del self._parked[block]
            self._num_free -= 1
            return
        start = self._run_of(block)
        if start is None:
            raise RuntimeError(f"block {block} is not free")
        end = self._remove_run(start)
        if start < block:
            self._add_run(start, block)
        if block + 1 < end:
            self._add_run(block + 1, end)
        self._num_free -= 1

    def _add_run(self, start: int, end: int) -> None:
        bisect.insort(self._starts, start)
        self._end_of[start] = end
        self._start_of[end] = start
        heapq.heappush(self._longest, (start - end, start))
        if len(self._longest) > 2 * len(self._starts) + 64:  # bounded: drop the stale entries
            self._longest = [(s - self._end_of[s], s) for s in self._starts]
            heapq.heapify(self._longest)

    def _remove_run(self, start: int) -> int:
        """Forget the run starting at ``start`` (its heap entry goes stale); returns its end."""
        end = self._end_of.pop(start)
        del self._start_of[end]
        del self._starts[bisect.bisect_left(self._starts, start)]
        return end
