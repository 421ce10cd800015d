"""The n-gram index behind the 'ngram' and 'auto' proposers, against its definition."""

from __future__ import annotations

import random

import pytest

from specdec_core.speculation.ngram_index import NgramIndex


def brute_force_lookup(ids: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """The definition: the most recent earlier occurrence of the longest suffix that has one."""
    for n in range(min(max_n, len(ids) - 1), min_n - 1, -1):
        suffix = ids[len(ids) - n:]
        for start in range(len(ids) - n - 1, -1, -1):
            if ids[start:start + n] == suffix:
                return ids[start + n:start + n + k]
    return []


@pytest.mark.parametrize("min_n,max_n", [(1, 4), (2, 3), (3, 3)])
def test_ngram_index_matches_the_definition_as_text_grows(min_n, max_n):
    rng = random.Random(min_n * 10 + max_n)
    for _ in range(20):
        ids = [rng.randrange(6) for _ in range(rng.randrange(1, 12))]
        index = NgramIndex(min_n, max_n)
        for _ in range(30):
            k = rng.randrange(0, 6)
            assert index.lookup(ids, k) == brute_force_lookup(ids, k, min_n, max_n)[:k]
            ids += [rng.randrange(6) for _ in range(rng.randrange(1, 4))]
