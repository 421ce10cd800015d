"""Small random suffix tries over a 4-token alphabet, with a context to look up: the input of the
tests that compare a trie's proposals (chains, trees, their cuts) on many random texts."""

from __future__ import annotations

import random

from specdec_core.speculation.suffix_trie import SuffixTrie


def random_trie(rng: random.Random) -> tuple[SuffixTrie, list[int]]:
    """A depth-8 trie of 1-6 random texts of 2-30 tokens, and a random context of 1-6 tokens."""
    trie = SuffixTrie(8)
    for _ in range(rng.randint(1, 6)):
        trie.add([rng.randrange(4) for _ in range(rng.randint(2, 30))])
    return trie, [rng.randrange(4) for _ in range(rng.randint(1, 6))]
