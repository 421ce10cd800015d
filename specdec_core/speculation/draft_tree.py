"""A token tree of drafts: several continuations verified in one target forward (a leaf module).

A lookup that knows more than one likely continuation (the suffix trie's counts) proposes them
all as a tree; the target scores every node once, each node attending to the request's tokens
and its own ancestors only, and verification keeps the longest path the target agrees with. For
the same verified rows a tree commits more tokens than one chain (SpecInfer, arXiv 2305.09781;
suffix decoding's tree mode, arXiv 2411.04975).

Nodes are in preorder with the likelier child first, so ``parents[j] < j``, and the first nodes
are the chain a linear proposal would have given as far as the tree keeps it: a chain is the
tree whose node j has parent j - 1, and it is verified and scored exactly as before.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import NamedTuple


class TokenEvidence(NamedTuple):
    """What a lookup knew of one node when it proposed it: a ``key`` naming the kind of evidence
    (the n-gram's length, the suffix match's length and count ratio, the node's depth), under
    which ``lookup_calibration`` counts how often such nodes were kept, and the lookup's own
    estimate of that chance (``prior``), trusted until the counts say otherwise."""

    key: Hashable
    prior: float


@dataclass(frozen=True)
class DraftTree:
    """``tokens[j]`` follows node ``parents[j]`` (-1: the request's last token). Siblings carry
    distinct tokens (at most one of them can be the target's choice). ``evidence``: one per node
    where the proposer gives it (lookups do), else empty."""

    tokens: list[int]
    parents: list[int] = field(default_factory=list)
    evidence: tuple[TokenEvidence, ...] = ()

    def __post_init__(self) -> None:
        if not self.parents:
            object.__setattr__(self, "parents", list(range(-1, len(self.tokens) - 1)))
        if len(self.parents) != len(self.tokens) or any(not -1 <= p < j for j, p in enumerate(self.parents)):
            raise ValueError("a draft tree's parents must precede their children")
        if self.evidence and len(self.evidence) != len(self.tokens):
            raise ValueError("a draft tree's evidence must have one entry per node")

    @staticmethod
    def chain(tokens: list[int], evidence: tuple[TokenEvidence, ...] = ()) -> "DraftTree":
        return DraftTree(list(tokens), evidence=tuple(evidence))

    def first(self, n: int) -> "DraftTree":
        """The first ``n`` nodes (a chain's first ``n`` tokens; in a tree, each node's parent
        precedes it, so any prefix is a tree)."""
        return DraftTree(self.tokens[:n], self.parents[:n], self.evidence[:n])

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def chain_length(self) -> int:
        """How many first nodes form a chain (node j's parent j - 1): the linear proposal in it."""
        return next((j for j, p in enumerate(self.parents) if p != j - 1), len(self.parents))

    @property
    def first_chain(self) -> list[int]:
        """The tokens of the chain the tree starts with (``chain_length`` of them)."""
        return self.tokens[:self.chain_length]

    @property
    def is_chain(self) -> bool:
        return self.chain_length == len(self.parents)

    @property
    def depths(self) -> list[int]:
        """Per node, its depth (1: it follows the request's last token)."""
        depths: list[int] = []
        for p in self.parents:
            depths.append(depths[p] + 1 if p >= 0 else 1)
        return depths

    def follows(self, truth: list[int]) -> list[bool]:
        """Per node, whether its path is ``truth``'s first tokens: what a greedy verification
        against ``truth`` keeps (nodes deeper than ``truth`` are not decided: False)."""
        matched: list[bool] = []
        for token, parent, depth in zip(self.tokens, self.parents, self.depths, strict=True):
            matched.append((parent < 0 or matched[parent]) and depth <= len(truth) and truth[depth - 1] == token)
        return matched

    def paths(self) -> list[list[int]]:
        """Per node, the nodes from the root's child down to itself: what it continues, and what
        it attends to in the forward."""
        paths: list[list[int]] = []
        for j, p in enumerate(self.parents):
            paths.append((paths[p] if p >= 0 else []) + [j])
        return paths


class Lookup:
    """One lookup made at a cap (``LookupProposer.propose``): its drafts (``tree``), priced by the
    policy and scored by the commit, and for the k the policy chooses, the drafts a lookup at k
    gives (``cut``) without looking again: the step verifies what the policy priced, and a request
    is looked up once a step. Here ``cut`` is ``tree``'s first k nodes, exact for a lookup whose
    drafts for k are the first k of those for a larger k (the n-gram lookup: the tokens after
    one match, cut where a grammar, which accepts tokens one after another, rejects one); a
    proposer where k changes more than that overrides it (``suffix.SuffixLookup``)."""

    def __init__(self, tree: DraftTree) -> None:
        self.tree = tree

    def cut(self, k: int) -> DraftTree:
        """The drafts a lookup at ``k`` (at most the cap) would have given."""
        return self.tree if k >= len(self.tree) else self.tree.first(max(k, 0))
