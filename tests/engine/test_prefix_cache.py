"""Prefix caching: a prompt that starts with an earlier prompt's full prefill chunks reuses their
keys and values (the blocks that hold them, or a copy), and gets exactly the output a recompute
gives: token for token greedy and seeded-sampled, in fp32 and int8, with and without drafts."""

from __future__ import annotations

import random

import pytest

from specdec_core import Engine, EngineConfig, SamplingParams
from specdec_core.engine.prefix_cache import ChunkHit, PrefixCache
from tests.helpers.engine_runs import logprob_values, run_to_end
from tests.helpers.models import load

CHUNK = 8


@pytest.fixture(scope="module")
def pair(tiny_target, tiny_draft):
    return load(tiny_target), load(tiny_draft, role="draft")


def engine(pair, caching: bool, quantize: str = "int8", **kw) -> Engine:
    config = EngineConfig(speculative_method="draft", max_num_seqs=3, max_model_len=128, prefill_chunk_size=CHUNK, block_size=4,
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
    """Both prompts run at once: the second finds the first's chunks in a running request's blocks
    and copies them."""
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
    assert b.stats.cached_tokens == 3 * CHUNK and not a.blocks and not b.blocks
    assert warm.scheduler.pool.num_free == warm.scheduler.pool.num_blocks
    assert b.output_ids == want


def test_only_full_prompt_chunks_are_shared():
    cache = PrefixCache(4, block_size=2)
    prompt = list(range(100, 111))  # 11 tokens: 2 full chunks, in blocks (0, 1) and (2, 3)
    recorded = cache.record([0, 1, 2, 3, 4, 5], prompt, computed=11, draft_computed=5, recorded=(0, 0))
    assert recorded == (2, 1)  # the draft has computed the first chunk only
    def free(b: int) -> bool:
        return True
    assert cache.lookup(prompt + [1, 2], free) == [ChunkHit((0, 1), True), ChunkHit((2, 3), False)]
    assert len(cache.lookup(prompt[:8], free)) == 1  # one token must be left to compute
    assert cache.lookup([7] + prompt[1:], free) == []  # a different first chunk
    cache.record([0, 1, 2, 3, 4, 5], prompt, computed=11, draft_computed=11, recorded=recorded)
    assert cache.lookup(prompt, free)[1].draft
    cache.forget([3])  # block 3 handed out again: the second chunk is gone
    assert cache.lookup(prompt, free) == [ChunkHit((0, 1), True)]
    cache.forget([0])
    assert cache.lookup(prompt, free) == []


def test_a_free_holder_is_preferred_to_a_copy():
    cache = PrefixCache(4, block_size=4)
    prompt = list(range(9))
    cache.record([5, 6, 7], prompt, computed=9, draft_computed=0, recorded=(0, 0))
    cache.record([1, 2, 3], prompt, computed=9, draft_computed=0, recorded=(0, 0))
    assert [h.blocks for h in cache.lookup(prompt, lambda b: b in (5, 6))] == [(5,), (6,)]
    assert [h.blocks for h in cache.lookup(prompt, lambda b: b in (1, 2))] == [(1,), (2,)]


@pytest.fixture(scope="module")
def small_chunks(tiny_target, tiny_draft, tmp_path_factory):
    from tests.helpers.servers import ServerProcess, serving, tiny_args

    with serving(ServerProcess([*tiny_args(tiny_target, tiny_draft), "--prefill-chunk-size", "16"],
                               tmp_path_factory.mktemp("prefix") / "server.log")) as srv:
        yield srv


def test_usage_reports_the_cached_prompt_tokens_as_openai_does(small_chunks):
    """A chat that resends its history: the second turn's usage says how much of the prompt the
    cache served (``prompt_tokens_details.cached_tokens``), and the answer is the uncached one."""
    from openai import OpenAI

    client = OpenAI(base_url=small_chunks.url + "/v1", api_key="unused")
    system = {"role": "system", "content": "You review Python code for bugs. " * 12}
    turn = [system, {"role": "user", "content": "def add(a, b): return a - b"}]
    first = client.chat.completions.create(model="tiny", messages=turn, max_tokens=8, temperature=0)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    again = client.chat.completions.create(model="tiny", messages=turn, max_tokens=8, temperature=0)
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert cached % 16 == 0 and again.usage.prompt_tokens - 16 <= cached < again.usage.prompt_tokens
    assert again.choices[0].message.content == first.choices[0].message.content
    longer = turn + [{"role": "assistant", "content": first.choices[0].message.content},
                     {"role": "user", "content": "And def mul(a, b): return a + b"}]
    follow = client.chat.completions.create(model="tiny", messages=longer, max_tokens=8, temperature=0)
    assert follow.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 16
    # vLLM's cache_salt: the same history under a salt starts cold, then finds its own blocks
    salted = [client.chat.completions.create(model="tiny", messages=turn, max_tokens=8, temperature=0,
                                             extra_body={"cache_salt": "tenant-a"}) for _ in range(2)]
    assert [r.usage.prompt_tokens_details.cached_tokens for r in salted] == [0, cached]
    assert salted[1].choices[0].message.content == first.choices[0].message.content


def test_a_prefix_shorter_than_a_chunk_is_reused_block_by_block(pair):
    """13 shared tokens are less than two chunks of 8 but three blocks of 4: the cache serves 12,
    and the answer is still the recompute's (greedy and seeded, int8)."""
    first, _ = prompts(3)
    second = first[:13] + [5, 6, 7, 8, 9]
    for params in (SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True),
                   SamplingParams(max_tokens=12, temperature=1.0, seed=3, ignore_eos=True)):
        want = run_one(engine(pair, caching=False), second, params).output_ids
        warm = engine(pair, caching=True)
        run_one(warm, first, params)
        got = run_one(warm, second, params)
        assert got.stats.cached_tokens == 12 and got.output_ids == want


@pytest.mark.parametrize("quantize", ["none", "int8"])
def test_a_prompt_block_has_the_same_rows_however_the_prompt_is_chunked(tiny_target, quantize):
    """What lets the cache share any full block: a prompt computed in one forward, in chunks cut
    at other block boundaries, after a cached prefix, or a token at a time as decoding feeds
    them gives every row the same logits, bit for bit (each row attends on its own)."""
    import torch

    from specdec_core.execution.forward_plan import ForwardItem
    from tests.helpers.runners import TEST_BLOCK, region, slot_runner

    model = load(tiny_target).model
    rng = random.Random(5)
    # 600 tokens: attention's own blocking (64-row query and 512-key blocks) differs between these
    # cuts, so one call per chunk would give some rows other bits (checked: this test then fails)
    prompt = [rng.randrange(3, 40000) for _ in range(600)]
    runs = []
    for cuts in ([0, 600], [0, 208, 512, 600], [0, TEST_BLOCK, 592, 600], [0, 520, *range(521, 601)]):
        runner = slot_runner(model, 1, 640, vocab_size=model.config.vocab_size, quantize=quantize)
        rows = [runner.forward([ForwardItem(region(0, 640), a, prompt[a:b], b - a)]) for a, b in zip(cuts, cuts[1:])]
        runs.append(torch.cat(rows))
    assert all(torch.equal(runs[0], other) for other in runs[1:])


def test_a_cache_salt_shares_blocks_only_with_the_same_salt(pair):
    """vLLM's ``cache_salt``: a salted prompt neither finds an unsalted or differently salted
    prefix nor leaves one for them; with the same salt it is reused, and the output is unchanged."""
    first, second = prompts(3)
    greedy = {"max_tokens": 6, "temperature": 0.0, "ignore_eos": True}
    want = run_one(engine(pair, caching=False), second, SamplingParams(**greedy)).output_ids
    eng = engine(pair, caching=True)
    run_one(eng, first, SamplingParams(**greedy, cache_salt="tenant-a"))
    got = run_one(eng, second, SamplingParams(**greedy, cache_salt="tenant-a"))
    assert got.stats.cached_tokens == 3 * CHUNK and got.output_ids == want
    for salt in (None, "tenant-b"):  # tenant-a's blocks of both prompts are cached now
        assert run_one(eng, second, SamplingParams(**greedy, cache_salt=salt)).stats.cached_tokens == 0
    with pytest.raises(ValueError, match="cache_salt"):
        SamplingParams(cache_salt="")


@pytest.mark.parametrize("attention", ["segments", "packed"])
@pytest.mark.parametrize("params", [SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True, logprobs=1),
                                    SamplingParams(max_tokens=20, temperature=1.0, seed=4, ignore_eos=True, logprobs=1)],
                         ids=["greedy", "seeded"])
def test_a_later_turn_finds_the_answer_it_resends_cached_and_gets_a_recompute(pair, attention, params):
    """Chat apps and agents re-send the model's earlier answers. Where every row attends on its
    own (``rows_alone``: the CPU's segments), the rows decoding wrote are the rows a prefill of
    the same tokens computes, so the next turn takes them from the cache and gets exactly the
    logits and tokens of a cold recompute. Where rows share attention calls (packed attention),
    only the prompt's chunks are shared. fp32, where a last-bit difference in a cached row shows
    in the log-probabilities (int8 rounds the activations, and such differences with them):
    with block segments for prompts, as before, the seeded and greedy cases here fail."""
    rng = random.Random(6)
    first = [rng.randrange(3, 40000) for _ in range(13)]

    def turn(eng: Engine, prompt: list[int]) -> tuple[int, list[int], list[float]]:
        [(req, deltas)] = run_to_end(eng, [prompt], params)
        return req.stats.cached_tokens, req.output_ids, logprob_values(deltas)

    warm = engine(pair, caching=True, quantize="none", attention=attention)
    assert warm.scheduler.share_outputs == (attention == "segments")
    answer = turn(warm, first)[1]
    second = first + answer + [rng.randrange(3, 40000) for _ in range(5)]  # the next turn
    cached, tokens, logprobs = turn(warm, second)
    _, want_tokens, want_logprobs = turn(engine(pair, caching=False, quantize="none", attention=attention), second)
    # 13 prompt tokens and 19 of the 20 answered have rows (the last is never fed): 8 blocks of 4;
    # the prompt's own: 3 blocks
    assert cached == (32 if attention == "segments" else 12)
    assert tokens == want_tokens and len(logprobs) == 20
    assert logprobs == want_logprobs  # exact floats, not within a tolerance


def test_an_unrelated_request_between_turns_leaves_the_cached_prefix(pair):
    """An agent's side requests (Claude Code's titles, Codex's sub-agents) come between the turns of
    a session: while the pool has free blocks that hold nothing cached, a new request takes those,
    not the blocks of an earlier prompt's cached chunks."""
    first, second = prompts(3)
    other = [t + 1 for t in prompts(4)[0]]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    eng = engine(pair, caching=True)
    run_one(eng, first, params)
    assert run_one(eng, other, params).stats.cached_tokens == 0
    assert run_one(eng, second, params).stats.cached_tokens == 3 * CHUNK
