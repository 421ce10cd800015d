"""The prompt-lookup index of one request (a leaf: the request owns one, the n-gram proposer reads it)."""

from __future__ import annotations


class NgramIndex:
    """Prompt lookup for one request: the most recent earlier occurrence of its last n tokens
    (n from ``max_n`` down to ``min_n``), and the tokens that followed it.

    Every n-gram that has a follower maps to where that follower is; the index catches up with
    the request's tokens on each lookup (they only grow), so a step costs O(new tokens x n)
    dictionary updates instead of a scan of the whole text per request.
    """

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n, self.max_n = min_n, max_n
        self._follower: dict[tuple[int, ...], int] = {}
        self._indexed = 0  # n-grams ending before this position are in the index

    def lookup(self, ids: list[int], k: int) -> list[int]:
        return self.match(ids, k)[0]

    def match(self, ids: list[int], k: int) -> tuple[list[int], int]:
        """Up to ``k`` tokens that followed the most recent earlier occurrence of the longest
        matched suffix, and that suffix's length (0: no match)."""
        if k <= 0:
            return [], 0
        # Register n-grams ending at positions up to len - 2: each has a follower, and the
        # request's own suffix (ending at len - 1) is not matched against itself.
        for end in range(self._indexed, len(ids) - 1):
            for n in range(self.min_n, min(self.max_n, end + 1) + 1):
                self._follower[tuple(ids[end - n + 1:end + 1])] = end + 1
        self._indexed = max(self._indexed, len(ids) - 1)
        for n in range(min(self.max_n, len(ids) - 1), self.min_n - 1, -1):
            start = self._follower.get(tuple(ids[len(ids) - n:]))
            if start is not None:
                return ids[start:start + k], n
        return [], 0
