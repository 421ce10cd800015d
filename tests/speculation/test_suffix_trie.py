"""The suffix tries behind suffix decoding, against their definitions: counts of substrings, the
most frequent continuation of the longest match, updates that equal a rebuild, and the global
cache's token budget with eviction of the oldest request."""

from __future__ import annotations

import gc
import math
import random
from collections import Counter

import pytest

from specdec_core.decoding.sampling_params import SamplingParams
from specdec_core.engine.request import Request
from specdec_core.speculation.suffix import MIN_TOKEN_PROB, SuffixProposer
from specdec_core.speculation.suffix_trie import SuffixCache, SuffixIndex, SuffixTrie


def trie_counts(trie: SuffixTrie) -> Counter:
    """Every node's substring and count."""
    out: Counter = Counter()
    stack: list[tuple[tuple[int, ...], int]] = [((), trie.root)]
    while stack:
        path, node = stack.pop()
        if path:
            out[path] = trie.count(node)
        for t, child in trie.children(node).items():
            stack.append((path + (t,), child))
    return out


def substring_counts(sequences: list[list[int]], depth: int) -> Counter:
    """The definition: occurrences of every substring of at most ``depth`` tokens."""
    out: Counter = Counter()
    for seq in sequences:
        for i in range(len(seq)):
            for j in range(i + 1, min(i + depth, len(seq)) + 1):
                out[tuple(seq[i:j])] += 1
    return out


def brute_force_proposal(sequences: list[list[int]], context: list[int], k: int, depth: int,
                         max_match: int, min_prob: float, factor: float) -> tuple[list[int], int]:
    counts = substring_counts(sequences, depth)
    match = 0
    for m in range(min(max_match, len(context), depth - 1), 0, -1):
        w = tuple(context[len(context) - m:])
        if any(key[:-1] == w for key in counts if len(key) == m + 1):
            match = m
            break
    if match == 0:
        return [], 0
    node = tuple(context[len(context) - match:])
    out: list[int] = []
    while len(out) < min(k, math.ceil(factor * match)) and len(node) < depth:
        followers = {key[-1]: c for key, c in counts.items() if len(key) == len(node) + 1 and key[:-1] == node}
        if not followers:
            break
        token = max(followers, key=lambda t: (followers[t], -t))
        if followers[token] / counts[node] < min_prob:
            break
        out.append(token)
        node = node + (token,)
    return out, match


@pytest.mark.parametrize("depth", [2, 3, 6])
def test_incremental_index_equals_the_counts_of_a_rebuild(depth):
    rng = random.Random(depth)
    for _ in range(15):
        ids: list[int] = []
        index = SuffixIndex(depth)
        for _ in range(12):
            ids += [rng.randrange(4) for _ in range(rng.randrange(0, 4))]
            index.catch_up(ids)
            assert trie_counts(index.trie) == substring_counts([ids], depth)
            assert index.trie.nodes == 1 + len(substring_counts([ids], depth))
            assert index.trie.count(index.trie.root) == len(ids)


@pytest.mark.parametrize("depth,factor", [(4, 1.0), (8, 1.0), (8, 0.5), (16, 2.0)])
def test_proposals_follow_the_most_frequent_continuation_of_the_longest_match(depth, factor):
    rng = random.Random(depth * 7 + int(factor * 10))
    for _ in range(60):
        seqs = [[rng.randrange(5) for _ in range(rng.randrange(1, 25))] for _ in range(rng.randrange(1, 4))]
        trie = SuffixTrie(depth)
        for s in seqs:
            trie.add(s)
        context = [rng.randrange(5) for _ in range(rng.randrange(1, 10))]
        k = rng.randrange(0, 7)
        got = trie.propose(context, k, depth // 2, MIN_TOKEN_PROB, factor)
        want, match = brute_force_proposal(seqs, context, k, depth, depth // 2, MIN_TOKEN_PROB, factor)
        assert got.tokens == (want if k else [])
        if k and got.tokens:
            assert got.match_len == match and 0 < got.score <= len(got.tokens)


def test_a_proposal_stops_below_the_minimum_probability():
    few, many, late = SuffixTrie(8), SuffixTrie(8), SuffixTrie(8)
    for t in range(9):
        few.add([1, 2, 10 + t])  # each follower 1/9 >= 0.1
    for t in range(11):
        many.add([1, 2, 10 + t])  # each follower 1/11 < 0.1
        late.add([1, 2, 3, 10 + t])  # "1 2" -> 3 always, then 1/11 each
    assert few.propose([1, 2], 2, 4, MIN_TOKEN_PROB, 1.0).tokens == [10]
    assert many.propose([1, 2], 2, 4, MIN_TOKEN_PROB, 1.0).tokens == []
    assert late.propose([1, 2], 2, 4, MIN_TOKEN_PROB, 1.0).tokens == [3]
    rare = SuffixTrie(8)
    rare.add([1, 2, 3] + [1, 2, 4, 6] * 8 + [1, 2, 5, 6] * 8)  # 3, 4, 5 after "1 2": 1/17, 8/17, 8/17
    assert rare.propose([0, 1, 2], 3, 4, 0.5, 2.0).tokens == []  # no follower reaches 0.5
    assert rare.propose([0, 1, 2], 3, 4, 0.4, 2.0).tokens == [4, 6, 1]  # the lower id on a tie


def test_removing_a_sequence_leaves_exactly_the_rebuild_of_the_others():
    rng = random.Random(3)
    seqs = [[rng.randrange(4) for _ in range(rng.randrange(1, 30))] for _ in range(6)]
    trie = SuffixTrie(5)
    for s in seqs:
        trie.add(s)
    for drop in (2, 0, 5):
        trie.remove(seqs[drop])
        kept = [s for i, s in enumerate(seqs) if i not in (2, 0, 5)[: (2, 0, 5).index(drop) + 1]]
        assert trie_counts(trie) == substring_counts(kept, 5)
        assert trie.nodes == 1 + len(substring_counts(kept, 5))


def test_the_global_cache_keeps_its_token_budget_by_evicting_the_oldest():
    cache = SuffixCache(depth=6, budget=50)
    rng = random.Random(9)
    added: list[list[int]] = []
    for _ in range(40):
        seq = [rng.randrange(50) for _ in range(rng.randrange(1, 20))]
        cache.add(seq)
        added.append(seq)
        assert cache.tokens <= 50
        assert cache.trie.nodes <= 1 + cache.budget * cache.trie.depth  # the memory bound
        # What it holds is exactly the newest sequences that fit, as a rebuild would count them.
        held, total = [], 0
        for s in reversed(added):
            if total + len(s) > 50:
                break
            held.insert(0, s)
            total += len(s)
        assert cache.tokens == total and len(cache) == len(held)
        assert trie_counts(cache.trie) == substring_counts(held, 6)
    # A sequence longer than the budget keeps its last tokens.
    cache.add(list(range(100, 180)))
    assert cache.tokens == 50 and trie_counts(cache.trie) == substring_counts([list(range(130, 180))], 6)
    assert SuffixCache(6, 0).add([1, 2, 3]) is None and len(SuffixCache(6, 0)) == 0


def test_tries_allocate_nothing_the_garbage_collector_tracks():
    """Nodes are ints in the trie's lists: adding, evicting and indexing thousands of tokens
    leaves the tracked objects as they were but for the cache's own (its held sequences), so
    speculation never makes the cyclic collector walk the tries (a node object per node made a
    full collection every few seconds, ~350 ms each beside the default pair)."""
    rng = random.Random(4)
    seqs = [[rng.randrange(5000) for _ in range(200)] for _ in range(30)]
    gc.collect()
    gc.disable()
    try:
        before = len(gc.get_objects())
        cache = SuffixCache(depth=16, budget=2000)  # evicts: 30 x 200 tokens do not fit
        for seq in seqs:
            cache.add(seq)
        index = SuffixIndex(16)
        index.catch_up([t for seq in seqs[:5] for t in seq])
        grown = len(gc.get_objects()) - before
    finally:
        gc.enable()
    assert cache.trie.nodes > 10_000 and index.trie.nodes > 10_000
    assert grown <= len(cache) + 20  # the held sequences (lists); the tries' and index's few containers


def _request(ids: list[int], *, seed: int | None = None, temperature: float = 0.0, k: int = 4) -> Request:
    params = SamplingParams(max_tokens=10, temperature=temperature, seed=seed)
    return Request("r", ids, params, random.Random(0), None, k,  # type: ignore[arg-type]
                   suffix=SuffixIndex(8))


def test_a_request_without_speculation_does_not_feed_the_global_trie():
    proposer = SuffixProposer(depth=8, cache_tokens=1000)
    off = _request([50, 51], k=0)
    off.output_ids = [1, 2, 3, 4]
    proposer.retire(off)
    assert len(proposer.cache) == 0 and proposer.lookup(_request([9, 1, 2]), 2) == []
    on = _request([50, 51])
    on.output_ids = [1, 2, 3, 4]
    proposer.retire(on)
    assert len(proposer.cache) == 1 and proposer.lookup(_request([9, 1, 2]), 2) == [3, 4]


def test_seeded_requests_never_look_in_the_global_trie():
    proposer = SuffixProposer(depth=8, cache_tokens=1000)
    finished = _request([50, 51])
    finished.output_ids = [1, 2, 3, 4, 5, 6]
    proposer.retire(finished)
    greedy = _request([9, 1, 2])
    assert proposer.lookup(greedy, 3) == [3, 4]  # match "1 2": at most 2 tokens per 2 matched
    unseeded = _request([9, 1, 2], temperature=0.8)
    assert proposer.lookup(unseeded, 3) == [3, 4]
    seeded = _request([9, 1, 2], seed=5, temperature=0.8)
    assert proposer.lookup(seeded, 3) == []
    # Its own text still proposes.
    own = _request([1, 2, 7, 1, 2], seed=5, temperature=0.8)
    assert proposer.lookup(own, 3) == [7, 1]


def test_the_better_scoring_trie_wins():
    proposer = SuffixProposer(depth=8, cache_tokens=1000)
    for _ in range(5):
        done = _request([0])
        done.output_ids = [1, 2, 8, 8]
        proposer.retire(done)
    # Own text: "1 2" followed by 3 once and by 4 once (each 1/3 with the open occurrence).
    req = _request([1, 2, 3, 1, 2, 4, 1, 2])
    assert proposer.lookup(req, 2) == [8, 8]
    proposer.cache = SuffixCache(8, 1000)
    assert proposer.lookup(req, 2) == [3, 1]  # own trie only: 3 and 4 at 1/3 each (the lower id), then 1
