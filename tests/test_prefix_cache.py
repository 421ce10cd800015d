"""Prefix caching: a prompt that starts with an earlier prompt's full prefill chunks reuses their
keys and values (the slot that holds them, or a copy), and gets exactly the output a recompute
gives: token for token greedy and seeded-sampled, in fp32 and int8, with and without drafts."""

from __future__ import annotations

import random

import pytest
from conftest import load

from specdec_core import Engine, EngineConfig, SamplingParams
from specdec_core.engine.prefix_cache import PrefixCache

CHUNK = 8


@pytest.fixture(scope="module")
def pair(tiny_target, tiny_draft):
    return load(tiny_target), load(tiny_draft, role="draft")


def engine(pair, caching: bool, quantize: str = "int8", **kw) -> Engine:
    config = EngineConfig(speculative_method="draft", max_num_seqs=3, max_model_len=128, prefill_chunk_size=CHUNK,
                          num_speculative_tokens=3, adaptive_speculation=False, seed=0, quantize=quantize,
                          enable_prefix_caching=caching, **kw)
    return Engine.from_loaded(config, pair[0], pair[1])


def prompts(seed: int) -> tuple[list[int], list[int]]:
    """A 30-token prompt and a second one sharing its first 27 tokens (3 full chunks of 8)."""
    rng = random.Random(seed)
    first = [rng.randrange(3, 40000) for _ in range(30)]
    return first, first[:27] + [rng.randrange(3, 40000) for _ in range(12)]


def run_one(eng: Engine, prompt: list[int], params: SamplingParams):
    req = eng.make_request(prompt, params)
    eng.add_request(req)
    while eng.has_unfinished():
        eng.step()
    return req


@pytest.mark.parametrize("quantize", ["none", "int8"])
@pytest.mark.parametrize("params", [SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True),
                                    SamplingParams(max_tokens=12, temperature=1.0, seed=7, ignore_eos=True)],
                         ids=["greedy", "seeded"])
def test_a_repeated_prefix_is_reused_and_the_output_is_a_recompute(pair, quantize, params):
    first, second = prompts(1)
    cold = engine(pair, caching=False, quantize=quantize)
    want = run_one(cold, second, params).output_ids
    warm = engine(pair, caching=True, quantize=quantize)
    run_one(warm, first, params)
    got = run_one(warm, second, params)
    assert got.stats.cached_tokens == 3 * CHUNK and warm.metrics.prefix_cache_hit_tokens == 3 * CHUNK
    assert got.output_ids == want


def test_a_prefix_held_by_a_running_request_is_copied(pair):
    """Both prompts run at once: the second finds the first's chunks in a busy slot and copies them."""
    first, second = prompts(2)
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    cold = engine(pair, caching=False)
    want = run_one(cold, second, params).output_ids
    warm = engine(pair, caching=True)
    a = warm.make_request(first, params)
    warm.add_request(a)
    while a.num_computed < len(first):  # the first prompt is prefilled, its request still running
        warm.step()
    b = warm.make_request(second, params)
    warm.add_request(b)
    while warm.has_unfinished():
        warm.step()
    assert b.stats.cached_tokens == 3 * CHUNK and b.slot is None and a.slot is None
    assert b.output_ids == want


def test_only_full_prompt_chunks_are_shared():
    cache = PrefixCache(4)
    prompt = list(range(100, 111))  # 11 tokens: 2 full chunks
    cache.record(0, prompt, computed=11)
    assert cache.lookup(prompt + [1, 2], prefer={0}).length == 8
    assert cache.lookup(prompt[:9], prefer=set()).length == 8  # a copy: slot 0 is not free
    assert cache.lookup(prompt[:8], prefer={0}).length == 4  # one token must be left to compute
    assert cache.lookup([7] + prompt[1:], prefer={0}) is None  # a different first chunk
    cache.keep_only(0, 4)
    assert cache.lookup(prompt, prefer={0}).length == 4
    cache.keep_only(0, 0)
    assert cache.lookup(prompt, prefer={0}) is None
