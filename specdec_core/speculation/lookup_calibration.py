"""How likely a looked-up draft is to be kept, from what the lookup knew when it proposed it,
counted over every lookup this process made (a leaf: the policy owns one, the commit feeds it).

Why. The policy priced a request's lookups with one acceptance per source and request, as a
geometric chain. But whether a looked-up token is kept depends mostly on what the lookup found,
and that changes from one pass to the next within a request: replaying the agentic sessions
(1.5B target), an n-gram matched on its last token alone kept 29% of its first drafts and one
matched on 4 tokens 90%; a suffix token that followed a 12-token match 9 times in 10 was kept
97% of the time, one after a 1-2 token match 4-57% (docs/speculation-measurements.md, "Lookups
priced by their evidence"). One estimate per request averages those away.

The table: for each evidence key (``TokenEvidence.key``, chosen by the proposer) how many nodes
with it were reached (the first node, or a node whose parent was kept) and how many of those
were kept, starting from the proposer's own estimate (``prior``) as if from ``PRIOR_WEIGHT``
nodes. Every lookup the policy made is scored against what its pass committed, chosen or not,
as a request's own estimate is. Counts halve past ``MEMORY`` reached nodes, so the table
follows traffic that changes character.

It is shared by the whole process, so one request's drafts depend on what the others taught:
that moves speed only, never output. A seeded request's k must not depend on other requests
(``policy.solo_k``); those requests never read it.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable

from specdec_core.speculation.draft_tree import DraftTree, TokenEvidence

PRIOR_WEIGHT = 2.0  # nodes' worth of trust in a lookup's own estimate, before any count
MEMORY = 512.0  # a key's counts halve when it has been reached this often


class LookupCalibration:
    """Kept and reached counts per evidence key."""

    def __init__(self) -> None:
        self._counts: dict[Hashable, tuple[float, float]] = {}
        self.scored = 0  # nodes counted since start (every key, before any halving)

    def chance(self, evidence: TokenEvidence) -> float:
        """How likely a node with this evidence is to be kept once its parent was."""
        kept, reached = self._counts.get(evidence.key, (0.0, 0.0))
        return (kept + evidence.prior * PRIOR_WEIGHT) / (reached + PRIOR_WEIGHT)

    def expected(self, tree: DraftTree) -> list[float]:
        """Tokens one verify pass commits on average, by how many of the tree's nodes it
        verifies (index 0: none): the target's own token plus, for the likeliest nodes first,
        the chance that each node's whole path is kept. A node's chance is at most its
        parent's, so the likeliest first never takes a node before its parent (the suffix
        trie builds its trees best first as well)."""
        path: list[float] = []
        for evidence, parent in zip(tree.evidence, tree.parents, strict=True):
            path.append(self.chance(evidence) * (path[parent] if parent >= 0 else 1.0))
        expected = [1.0]
        for p in sorted(path, reverse=True):
            expected.append(expected[-1] + p)
        return expected

    def score(self, tree: DraftTree, committed: list[int]) -> None:
        """One pass's verdict on a lookup: each node it decided (reached, and no deeper than the
        tokens ``committed``) counts as reached, and as kept where its token is the committed
        one at its depth. Nodes past the first rejection are not counted: nothing was learnt."""
        kept = tree.follows(committed)
        for evidence, parent, depth, node_kept in zip(tree.evidence, tree.parents, tree.depths, kept, strict=True):
            if (parent < 0 or kept[parent]) and depth <= len(committed):
                self._count(evidence.key, node_kept)

    def score_all(self, lookups: Iterable[DraftTree], committed: list[int]) -> None:
        """``score`` for every lookup a pass made (``ScheduledRequest.lookups``)."""
        for tree in lookups:
            if tree.evidence:
                self.score(tree, committed)

    def counts(self, key: Hashable) -> tuple[float, float]:
        """The key's kept and reached nodes (halved as they aged)."""
        return self._counts.get(key, (0.0, 0.0))

    def _count(self, key: Hashable, kept: bool) -> None:
        self.scored += 1
        k, n = self._counts.get(key, (0.0, 0.0))
        k, n = k + kept, n + 1
        if n > MEMORY:
            k, n = k / 2, n / 2
        self._counts[key] = (k, n)
