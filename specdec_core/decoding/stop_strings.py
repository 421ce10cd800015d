"""Stop strings as one Aho-Corasick automaton: the work per character does not depend on the stops.

Checking each stop string against the text every step costs (number of stops x their length) per
step on the engine thread, where every running request waits for it; a request with thousands of
long stop strings could stall everyone. The automaton is built once per set of stop strings
(cached, so the ``n`` choices of a request share it) and then reads each new character once:

- a stop string has appeared exactly when the state reached has an output (``_match``), and
- the longest suffix of the text that is still the beginning of some stop string is the depth of
  the state. That is exactly the text that must be held back; everything before it can be sent.

Transitions: the trie's edges, else the failure link (the next shorter suffix that is a trie node).
Each character adds at most one level of depth and each failure step removes at least one, so a
text of m characters costs at most 2m steps in all, and one call at most its own characters plus
the depth it started at (bounded by the longest stop string).

Building costs time and memory in the total length of the stop strings (about 7 us and 270 bytes
per character in CPython), once per set; the server bounds that length (``--max-stop-chars``).
"""

from __future__ import annotations

from collections import deque
from functools import lru_cache


class StopAutomaton:
    """The immutable automaton of one set of stop strings (shared; see ``stop_automaton``)."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        if not stops or not all(stops):
            raise ValueError("stop strings must be a non-empty set of non-empty strings")
        self._edges: list[dict[str, int]] = [{}]
        self.depth: list[int] = [0]
        for stop in stops:
            node = 0
            for ch in stop:
                nxt = self._edges[node].get(ch)
                if nxt is None:
                    nxt = len(self._edges)
                    self._edges[node][ch] = nxt
                    self._edges.append({})
                    self.depth.append(self.depth[node] + 1)
                node = nxt
        ends = {self._walk(stop) for stop in stops}
        self._fail = [0] * len(self._edges)
        # Length of the longest stop string ending at a node's text (0: none), found via failure links.
        self._match = [self.depth[n] if n in ends else 0 for n in range(len(self._edges))]
        queue = deque(self._edges[0].values())
        while queue:
            node = queue.popleft()
            for ch, child in self._edges[node].items():
                queue.append(child)
                f = self._fail[node]
                while f and ch not in self._edges[f]:
                    f = self._fail[f]
                target = self._edges[f].get(ch, 0)
                self._fail[child] = target if target != child else 0
                if not self._match[child]:
                    self._match[child] = self._match[self._fail[child]]

    def _walk(self, text: str) -> int:
        node = 0
        for ch in text:
            node = self._edges[node][ch]
        return node


@lru_cache(maxsize=16)
def stop_automaton(stops: tuple[str, ...]) -> StopAutomaton:
    """The automaton for ``stops``; cached, since a request's choices (and many requests) repeat them."""
    return StopAutomaton(stops)


class StopScanner:
    """One request's position in the automaton: feed it the text as it grows."""

    def __init__(self, stops: list[str]) -> None:
        self._automaton = stop_automaton(tuple(dict.fromkeys(stops)))
        self._state = 0
        # Transitions taken so far (edges and failure links): the scanning work, which tests bound.
        self.work = 0

    @property
    def held(self) -> int:
        """Characters at the end of the text fed so far that may still begin a stop string."""
        return self._automaton.depth[self._state]

    def feed(self, text: str) -> tuple[int, int] | None:
        """Read ``text``; at the first stop string completed, return ``(end, length)``: it is
        ``text[:end]`` that completes it, and the stop string is the last ``length`` characters
        of everything fed so far (the longest stop string ending there). The state is then left
        at that point; feeding more after a stop string is meaningless."""
        auto = self._automaton
        edges, fail, match = auto._edges, auto._fail, auto._match
        state, work = self._state, 0
        for i, ch in enumerate(text):
            while True:
                work += 1
                nxt = edges[state].get(ch)
                if nxt is not None:
                    state = nxt
                    break
                if state == 0:
                    break
                state = fail[state]
            if match[state]:
                self._state, self.work = state, self.work + work
                return i + 1, match[state]
        self._state, self.work = state, self.work + work
        return None
