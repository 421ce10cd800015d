"""Suffix tries with counts: the structures behind suffix decoding (a leaf module: the request owns a
``SuffixIndex``, the suffix proposer owns the global ``SuffixCache``; neither imports the engine).

A ``SuffixTrie`` of depth D holds every substring of at most D tokens of the sequences added to it,
each node counting how often its substring occurs. That is a suffix tree cut at depth D (Oliaro et
al., arXiv 2411.04975, keep whole suffixes; the bounded depth is what vLLM's and Arctic's
``max_tree_depth`` does too): appending a token touches at most D + 1 nodes, removing a sequence
undoes exactly what adding it did, and ``count(w + [t]) / count(w)`` is how often ``t`` followed
``w``, the score a proposal's tokens are chosen and cut by.

A node is an integer: its count and its children (token -> node, made when the first child is)
live in two lists the trie owns, and freed nodes are reused. So the tries hold no object the
garbage collector tracks (a dict of ints to ints is untracked). With a node object per node,
every trie update allocated tracked objects: the collector ran every few steps, and now and then
a full pass walked every tracked object, the tries' nodes among them (~315 ms beside the default
pair's 490K startup objects, on the engine thread, only where speculation was on). A sequence of
n tokens adds at most n * D nodes (fewer where text repeats), so a token budget is a memory bound.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field

Pick = tuple[int, int, int, tuple[float, int]]  # a tree node as taken: (parent as taken, token, rank, ratio)


@dataclass(frozen=True)
class Proposal:
    """Tokens proposed after a context (a chain, or a tree where ``parents`` is given: the
    nodes in preorder, as ``DraftTree``), the length of the context's suffix they continue, and
    their score: the expected number accepted if each token is right with its count ratio.
    ``ratios``: per token, its count ratio and the count it was taken of (how often its
    parent's text occurred), the evidence the proposer prices it by. ``running``: the score
    after each node in the order the proposal took them (a chain's order; a tree's best first,
    whose nodes as taken are ``picked``), so ``first`` cuts it without walking the trie again."""

    tokens: list[int]
    match_len: int
    score: float
    ratios: list[tuple[float, int]] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    running: tuple[float, ...] = ()
    picked: tuple[Pick, ...] = ()

    @staticmethod
    def none() -> "Proposal":
        return Proposal([], 0, 0.0)

    def first(self, k: int) -> "Proposal":
        """The proposal the same trie and context give at most ``k`` tokens, ``k`` at most the
        one this was proposed at: a proposal takes its nodes one at a time and ``k`` only stops
        it (``propose``'s chain, ``propose_tree``'s pops), so its first ``k`` nodes as taken
        and their running score are that proposal, exactly (a tree's are laid out in preorder
        again). This is what lets a step verify the lookup its policy priced, made once."""
        if k <= 0:
            return Proposal.none()
        if k >= len(self.tokens):
            return self
        if not self.picked:
            return Proposal(self.tokens[:k], self.match_len, self.running[k - 1], self.ratios[:k],
                            running=self.running[:k])
        tokens, parents, ratios = _preorder(list(self.picked[:k]))
        return Proposal(tokens, self.match_len, self.running[k - 1], ratios, parents, self.running[:k],
                        self.picked[:k])


ROOT = 0


class SuffixTrie:
    """Counts of every substring of at most ``depth`` tokens of the added sequences."""

    def __init__(self, depth: int) -> None:
        if depth < 2:
            raise ValueError("a suffix trie needs depth >= 2 (a match and a token after it)")
        self.depth = depth
        self.root = ROOT
        self._count: list[int] = [0]  # node -> occurrences of its substring
        self._kids: list[dict[int, int] | None] = [None]  # node -> {token: child}, None for a leaf
        self._free: list[int] = []  # ids of freed nodes, reused first

    @property
    def nodes(self) -> int:
        """Nodes alive, the root included (what the memory bound counts)."""
        return len(self._count) - len(self._free)

    def count(self, node: int) -> int:
        return self._count[node]

    def children(self, node: int) -> dict[int, int]:
        """``node``'s children by token (empty for a leaf); read only."""
        return self._kids[node] or {}

    # ------------------------------------------------------------------ updates

    def append(self, open_nodes: list[int], token: int) -> list[int]:
        """Count ``token`` after the sequence whose open suffixes (lengths 1..depth-1, shortest
        first) are ``open_nodes``; returns the new open suffixes. O(depth)."""
        nodes = [self._bump(parent, token) for parent in [ROOT] + open_nodes]
        self._count[ROOT] += 1
        return nodes[: self.depth - 1]

    def add(self, tokens: list[int]) -> None:
        """Count every substring of ``tokens`` of at most ``depth`` tokens. O(len x depth)."""
        open_nodes: list[int] = []
        for t in tokens:
            open_nodes = self.append(open_nodes, t)

    def remove(self, tokens: list[int]) -> None:
        """Undo ``add(tokens)``: nodes whose count reaches zero are freed."""
        count, kids = self._count, self._kids
        for start in range(len(tokens)):
            node = ROOT
            for t in tokens[start:start + self.depth]:
                below = kids[node]
                assert below is not None, "removing a sequence that was never added"
                child = below[t]
                count[child] -= 1
                if count[child] == 0:
                    self._free_subtree(child)
                    del below[t]
                    if not below:
                        kids[node] = None
                    break
                node = child
        count[ROOT] -= len(tokens)

    def _bump(self, parent: int, token: int) -> int:
        below = self._kids[parent]
        if below is None:
            below = self._kids[parent] = {}
        node = below.get(token)
        if node is None:
            node = below[token] = self._new_node()
        self._count[node] += 1
        return node

    def _new_node(self) -> int:
        if self._free:
            node = self._free.pop()
            self._count[node], self._kids[node] = 0, None
            return node
        self._count.append(0)
        self._kids.append(None)
        return len(self._count) - 1

    def _free_subtree(self, node: int) -> None:
        """Free ``node`` and everything below it (cut off together)."""
        stack = [node]
        while stack:
            n = stack.pop()
            below = self._kids[n]
            if below:
                stack.extend(below.values())
            self._kids[n] = None
            self._free.append(n)

    # ------------------------------------------------------------------ lookups

    def _walk(self, tokens: list[int]) -> int | None:
        node = ROOT
        for t in tokens:
            below = self._kids[node]
            if below is None:
                return None
            nxt = below.get(t)
            if nxt is None:
                return None
            node = nxt
        return node

    def longest_match(self, context: list[int], max_len: int) -> tuple[int, int | None]:
        """The longest suffix of ``context`` (at most ``max_len`` tokens) that occurs followed by
        something. Having a follower is monotone in the suffix's length (a shorter suffix of a
        followed occurrence is followed too), so a binary search needs O(log) walks."""
        lo, hi = 0, min(max_len, len(context), self.depth - 1)
        best: int | None = None
        while lo < hi:
            mid = (lo + hi + 1) // 2
            node = self._walk(context[len(context) - mid:])
            if node is not None and self._kids[node]:
                lo, best = mid, node
            else:
                hi = mid - 1
        return lo, best

    def propose(self, context: list[int], k: int, max_match: int, min_prob: float, spec_factor: float) -> Proposal:
        """The most frequent continuation of the longest match: up to
        ``min(k, ceil(spec_factor x match length))`` tokens, each the most frequent child
        (ties: the lowest token id, so a lookup is a function of the counts), stopping where
        ``count(child) / count(node)`` falls below ``min_prob`` or the trie ends."""
        m, node = self.longest_match(context, max_match)
        if node is None or k <= 0:
            return Proposal.none()
        count, kids = self._count, self._kids
        limit = min(k, math.ceil(spec_factor * m))
        tokens: list[int] = []
        ratios: list[tuple[float, int]] = []
        running: list[float] = []
        prob, score = 1.0, 0.0
        below = kids[node]
        while len(tokens) < limit and below:
            token, child = max(below.items(), key=lambda kv: (count[kv[1]], -kv[0]))
            p = count[child] / count[node]
            if p < min_prob:
                break
            prob *= p
            score += prob
            tokens.append(token)
            ratios.append((p, count[node]))
            running.append(score)
            node, below = child, kids[child]
        return Proposal(tokens, m, score, ratios, running=tuple(running))

    def propose_tree(self, context: list[int], k: int, max_match: int, min_prob: float,
                     spec_factor: float) -> Proposal:
        """The ``k`` likeliest continuations of the longest match as one tree: nodes are taken
        best-first by path probability (the product of the count ratios from the match), each
        child at least ``min_prob`` of its parent's count, no deeper than
        ``ceil(spec_factor x match length)``; its score is the sum of the nodes' path
        probabilities (the expected tokens accepted). Where the trie does not branch this is
        ``propose``'s chain; where it does, the same number of nodes is worth more (a parent is
        always taken before its children, the likelier sibling first)."""
        m, node = self.longest_match(context, max_match)
        if node is None or k <= 0:
            return Proposal.none()
        count, kids = self._count, self._kids
        limit = math.ceil(spec_factor * m)
        order = 0  # a total order on ties, so a lookup is a function of the counts
        heap: list[tuple[float, int, int, int, int, tuple[float, int]]] = []

        def push(parent_node: int, parent: int, prob: float, depth: int) -> None:
            nonlocal order
            below = kids[parent_node]
            if depth >= limit or not below:
                return
            for token, child in sorted(below.items(), key=lambda kv: (-count[kv[1]], kv[0])):
                p = count[child] / count[parent_node]
                if p < min_prob:
                    break
                heapq.heappush(heap, (-prob * p, order, parent, token, child, (p, count[parent_node])))
                order += 1

        depth_of: list[int] = []
        picked: list[Pick] = []
        running: list[float] = []
        score = 0.0
        push(node, -1, 1.0, 0)
        while heap and len(picked) < k:
            neg, rank, parent, token, child, ratio = heapq.heappop(heap)
            picked.append((parent, token, rank, ratio))
            depth_of.append(1 + (depth_of[parent] if parent >= 0 else 0))
            score -= neg
            running.append(score)
            push(child, len(picked) - 1, -neg, depth_of[-1])
        tokens, parents, ratios = _preorder(picked)
        return Proposal(tokens, m, score, ratios, parents, tuple(running), tuple(picked))


def _preorder(picked: list[Pick]) -> tuple[list[int], list[int], list[tuple[float, int]]]:
    """Picked nodes renumbered depth first, each node's children in the order they were ranked
    (likelier first), so the first nodes are the greedy chain: their tokens, parents and ratios."""
    children: dict[int, list[int]] = {}
    for i, (parent, _, _, _) in enumerate(picked):
        children.setdefault(parent, []).append(i)
    tokens: list[int] = []
    parents: list[int] = []
    ratios: list[tuple[float, int]] = []
    stack = [(i, -1) for i in sorted(children.get(-1, []), key=lambda i: picked[i][2], reverse=True)]
    while stack:
        i, new_parent = stack.pop()
        tokens.append(picked[i][1])
        parents.append(new_parent)
        ratios.append(picked[i][3])
        here = len(tokens) - 1
        stack += [(c, here) for c in sorted(children.get(i, []), key=lambda c: picked[c][2], reverse=True)]
    return tokens, parents, ratios


class SuffixIndex:
    """One request's trie over its own prompt and output, caught up on each lookup (the text only
    grows): O(new tokens x depth) per step, as the n-gram index."""

    def __init__(self, depth: int) -> None:
        self.trie = SuffixTrie(depth)
        self._open: list[int] = []
        self._indexed = 0

    def catch_up(self, ids: list[int]) -> None:
        for t in ids[self._indexed:]:
            self._open = self.trie.append(self._open, t)
        self._indexed = max(self._indexed, len(ids))


class SuffixCache:
    """The global trie over the outputs of recently finished requests, bounded by a token budget:
    adding a sequence evicts the oldest ones until the total fits (a sequence longer than the
    budget keeps its last ``budget`` tokens). At most ``budget x depth`` nodes exist."""

    def __init__(self, depth: int, budget: int) -> None:
        self.trie = SuffixTrie(depth)
        self.budget = budget
        self.tokens = 0
        self._sequences: deque[list[int]] = deque()

    def add(self, tokens: list[int]) -> None:
        tokens = tokens[max(len(tokens) - self.budget, 0):] if self.budget > 0 else []
        if not tokens:
            return
        while self._sequences and self.tokens + len(tokens) > self.budget:
            old = self._sequences.popleft()
            self.trie.remove(old)
            self.tokens -= len(old)
        self.trie.add(tokens)
        self._sequences.append(tokens)
        self.tokens += len(tokens)

    def __len__(self) -> int:
        """Sequences held."""
        return len(self._sequences)
