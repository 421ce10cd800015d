"""The paged KV pool: sized from memory, shared by long and short requests, and never the reason a
request fails: a request that cannot get blocks preempts a younger one, which is recomputed."""

from __future__ import annotations

import random

import pytest

from specdec_core import Engine, EngineConfig, SamplingParams
from specdec_core.engine.block_pool import BlockPool
from specdec_core.engine.kv_sizing import parse_size
from specdec_core.execution.kv_cache import contiguous_base, token_rows
from tests.helpers.engine_runs import logprob_values, run_to_end
from tests.helpers.models import load

# The tiny pair: target 2 layers + draft 1 layer, 2 KV heads of 16 dims, fp32.
BYTES_PER_TOKEN = (2 + 1) * 2 * 2 * 16 * 4


@pytest.fixture(scope="module")
def pair(tiny_target, tiny_draft):
    return load(tiny_target), load(tiny_draft, role="draft")


def make(pair, quantize: str = "int8", **kw) -> Engine:
    config = EngineConfig(speculative_method="draft", num_speculative_tokens=3, adaptive_speculation=False, seed=0,
                          quantize=quantize, **kw)
    return Engine.from_loaded(config, pair[0], pair[1])


def test_block_tables_address_rows_in_runs():
    assert token_rows([4, 1], 4, 2, 7) == [18, 19, 4, 5, 6]
    assert contiguous_base([3, 4, 9], 4, 8) == 12 and contiguous_base([3, 4, 9], 4, 9) is None
    pool = BlockPool(12)
    a = pool.allocate(3)
    assert a == [0, 1, 2]
    b = pool.allocate(2)  # a new run starts mid-way into the free space, leaving room to grow
    assert b == [7, 8]
    assert pool.allocate(2, after=a[-1]) == [3, 4]  # growth continues the run
    pool.free(a)
    with pytest.raises(RuntimeError, match="twice"):
        pool.free(a[:1])


def test_parked_blocks_are_handed_out_last_least_recently_parked_first():
    """Free blocks that hold cached chunks are parked: taken where they lie, allocated only when
    the other free blocks run out, the least recently parked first."""
    pool = BlockPool(8)
    a, b = pool.allocate(3), pool.allocate(2)
    assert (a, b) == ([0, 1, 2], [5, 6])
    pool.free(a, parked=lambda block: block != 2)
    pool.free(b, parked=lambda block: True)
    assert pool.num_free == 8 and all(pool.is_free(block) for block in range(8))
    assert sorted(pool.allocate(4)) == [2, 3, 4, 7]  # every unparked block first
    assert pool.allocate(2) == [0, 1]  # then the parked ones, oldest first
    pool.take([5])  # a cached block reused where it lies
    assert pool.num_free == 1 and pool.is_free(6) and not pool.is_free(5)
    with pytest.raises(RuntimeError, match="twice"):
        pool.free([6])


def _scan_run_start(free: set[int], num_blocks: int) -> int:
    """The allocator's rule by a scan over every block: the longest free run (the lowest of equals),
    its middle when a used block ends just before it."""
    best_len, best_start, start, length = 0, -1, -1, 0
    for b in range(num_blocks + 1):
        if b < num_blocks and b in free:
            start, length = (b, 1) if length == 0 else (start, length + 1)
            continue
        if length > best_len:
            best_len, best_start = length, start
        length = 0
    return best_start + best_len // 2 if best_start > 0 and best_len > 1 else best_start


def test_the_indexed_pool_hands_out_what_a_scan_of_every_block_would():
    """Random allocations, growth, prefix takes and frees against a set and a full scan."""
    rng = random.Random(0)
    pool, free, tables = BlockPool(97), set(range(97)), []
    for _ in range(3000):
        op = rng.random()
        if op < 0.4 and free:
            expected = _scan_run_start(free, 97)
            table = pool.allocate(1)
            assert table == [expected]
            tables.append(table)
        elif op < 0.6 and tables and free:
            table = rng.choice(tables)
            grown = pool.allocate(1, after=table[-1])
            assert grown == [table[-1] + 1] if table[-1] + 1 in free else grown == [_scan_run_start(free, 97)]
            table += grown
        elif op < 0.7 and free:
            block = rng.choice(sorted(free))
            pool.take([block])
            tables.append([block])
        elif tables:
            pool.free(tables.pop(rng.randrange(len(tables))))
        free = set(range(97)) - {b for t in tables for b in t}
        assert pool.num_free == len(free) and all(pool.is_free(b) == (b in free) for b in range(97))
    assert len(pool._longest) <= 2 * len(pool._starts) + 65  # stale heap entries stay bounded


def test_sizes_parse():
    assert parse_size("8GiB") == 8 * 2**30 and parse_size("512 MB") == 512 * 2**20 and parse_size("4096") == 4096
    with pytest.raises(ValueError, match="memory size"):
        parse_size("lots")


def test_max_model_len_defaults_to_the_model_context(pair):
    eng = make(pair)
    assert eng.max_model_len == 4096 and eng.config.max_model_len == 4096  # the tiny models' max_position_embeddings
    assert eng.kv.num_blocks * eng.kv.block_size >= 4096


def test_a_pool_that_cannot_hold_one_request_is_refused_or_the_default_lowered(pair):
    with pytest.raises(ValueError, match="--kv-cache-memory"):
        make(pair, max_model_len=1024, kv_cache_memory=str(512 * BYTES_PER_TOKEN))
    eng = make(pair, kv_cache_memory=str(512 * BYTES_PER_TOKEN))
    assert eng.max_model_len == 512 - 3  # what the pool holds, less a step's drafts


def test_a_prompt_longer_than_the_old_default_context(pair):
    """3,000 prompt tokens: past the 2,048 every slot used to reserve."""
    eng = make(pair)
    prompt = [3 + (i * 7919) % 40000 for i in range(3000)]
    out = eng.generate([prompt], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))[0]
    assert len(out.token_ids) == 8


def test_requests_that_outgrow_the_pool_preempt_and_all_finish_as_alone(pair):
    """Six requests in a pool that holds about two of them at full length: the younger ones are
    preempted, recomputed from their tokens, and every one ends with the tokens it gets alone."""
    prompts = [[3 + (s * 131 + i * 17) % 40000 for i in range(20 + s)] for s in range(6)]
    params = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)
    roomy = make(pair, max_model_len=128)
    want = [roomy.generate([p], params)[0].token_ids for p in prompts]
    tight = make(pair, max_model_len=128, max_num_seqs=6, kv_cache_memory=str(176 * BYTES_PER_TOKEN))
    got = tight.generate(prompts, params)
    assert tight.metrics.num_preemptions > 0
    assert [c.token_ids for c in got] == want
    assert tight.scheduler.pool.num_free == tight.scheduler.pool.num_blocks


def test_a_preempted_request_recomputes_exactly_the_rows_it_had(pair):
    """On the CPU every row attends on its own, so the recompute of a preempted request (its
    prompt and output, fed as prompt chunks) gives the very rows its decoding wrote: in fp32,
    where a last-bit difference shows, every request's log-probabilities equal those it gets
    alone, float for float. (With prompts in block segments, as before, they did not.)"""
    prompts = [[3 + (s * 131 + i * 17) % 40000 for i in range(20 + s)] for s in range(6)]
    params = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True, logprobs=1)
    roomy = make(pair, "none", max_model_len=128)
    want = [logprob_values(run_to_end(roomy, [p], params)[0][1]) for p in prompts]
    tight = make(pair, "none", max_model_len=128, max_num_seqs=6, kv_cache_memory=str(176 * BYTES_PER_TOKEN))
    got = [logprob_values(deltas) for _, deltas in run_to_end(tight, prompts, params)]
    assert tight.metrics.num_preemptions > 0 and all(len(g) == 60 for g in got)
    assert got == want


def open_webui_tools(count: int = 36) -> list[dict]:
    """Tool definitions the size of Open WebUI's built-in ones (their number and wordiness)."""
    text = ("Searches the user's notes, chats, files and knowledge bases for passages related to the query "
            "and returns titles, snippets and links; use it when the user asks about something they saved. ")
    return [{"type": "function", "function": {
        "name": f"search_knowledge_{i}", "description": text * 2,
        "parameters": {"type": "object", "required": ["query"], "properties": {
            "query": {"type": "string", "description": "what to look for, in the user's own words"},
            "count": {"type": "integer", "description": "how many results to return, 1 to 20"},
            "collection": {"type": "string", "description": "which knowledge base to search, by name or id"}}}}}
        for i in range(count)]


def test_an_open_webui_sized_prompt_is_served_with_default_settings(smol_tokenizer_dir, tmp_path):
    """Open WebUI sends ~7,000 tokens (its 36 built-in tools); with the context no longer capped
    at 2,048 by per-slot reservations, a server started without --max-model-len answers it. A tiny
    model of 8,192 positions with SmolLM2's tokenizer and chat template: the sizing and the path
    are the ones a real model takes, the prompt's prefill is not the point."""
    import openai

    from tests.helpers.models import build_tiny
    from tests.helpers.servers import ServerProcess

    model = build_tiny(tmp_path / "model", smol_tokenizer_dir, "llama", 2, 64, 0, 49152, max_positions=8192)
    srv = ServerProcess(["--model", str(model), "--served-model-name", "smol", "--speculative-method", "ngram",
                         "--device", "cpu", "--max-num-seqs", "2"], tmp_path / "server.log")
    try:
        srv.wait_ready(timeout=600)
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=600)
        out = client.chat.completions.create(
            model="smol", tools=open_webui_tools(), max_tokens=8, temperature=0,
            messages=[{"role": "system", "content": "You are a helpful assistant. " * 20},
                      {"role": "user", "content": "What is the capital of France?"}])
    finally:
        srv.terminate()
    assert out.usage.prompt_tokens > 6000
    assert out.choices[0].finish_reason in ("stop", "length", "tool_calls")
