"""Capacity, rollback, continuous batching, stopping, detokenization, logprobs, async facade."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from specdec_core import AsyncEngine, Engine, EngineConfig, EngineDeadError, SamplingParams
from specdec_core.decoding.detokenizer import IncrementalDetokenizer
from specdec_core.decoding.structured_output import StructuredOutput
from tests.helpers.engine_runs import run_to_end
from tests.helpers.fault_hooks import fail_batches_holding, fail_planned_steps_holding, fail_requests_mentioning
from tests.helpers.models import load

PROMPTS = ["def add(a, b):", "Hello, my name is", "1 2 3 4 5", "The weather today"]


@pytest.fixture(scope="module")
def pair(tiny_target, tiny_draft):
    return load(tiny_target), load(tiny_draft, role="draft")


def make(pair, method="draft", **kw) -> Engine:
    kw.setdefault("seed", 0)
    return Engine.from_loaded(EngineConfig(speculative_method=method, **kw), pair[0], pair[1] if method == "draft" else None)


def test_cache_returns_to_zero_after_many_rejections(pair):
    eng = make(pair, max_num_seqs=4, num_speculative_tokens=5, adaptive_speculation=False)
    params = SamplingParams(max_tokens=20, temperature=1.0, ignore_eos=True)
    out = eng.generate(PROMPTS * 5, params)
    assert all(len(c.token_ids) == 20 for c in out)
    m = eng.metrics
    assert m.total_accepted_tokens < m.total_draft_tokens  # there were rejections to roll back
    assert eng.scheduler.kv_usage == 0.0 and eng.scheduler.pool.num_free == eng.scheduler.pool.num_blocks
    assert not eng.scheduler.running and not eng.scheduler.waiting


@pytest.mark.parametrize("method", ["draft", "ngram", "suffix"])
def test_failure_after_the_target_forward_is_retried_per_request(pair, method, monkeypatch):
    """A batched step that raises after the target forward (here: in verification, once) must
    leave every request as it was, so the per-request retry continues exactly where it stood:
    same tokens as a run without the fault, nobody stuck, every slot freed."""
    import specdec_core.speculation.verifier as verifier_module

    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    expected = [c.token_ids for c in make(pair, method, adaptive_speculation=False).generate(PROMPTS, params)]
    real = verifier_module.verify_greedy
    calls = {"n": 0}

    def fails_on_third_call(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("injected failure after the target forward")
        return real(*args, **kwargs)

    monkeypatch.setattr(verifier_module, "verify_greedy", fails_on_third_call)
    eng = make(pair, method, adaptive_speculation=False)
    reqs = [eng.make_request(p, params) for p in PROMPTS]
    for r in reqs:
        eng.add_request(r)
    steps = 0
    while eng.has_unfinished():
        eng.step()
        steps += 1
        assert steps < 200, "a request is stuck"
    assert calls["n"] > 3
    assert [r.output_ids for r in reqs] == expected
    assert all(r.finish_reason == "length" for r in reqs)
    assert eng.scheduler.kv_usage == 0.0


def test_prompt_longer_than_max_model_len_is_refused(pair):
    eng = make(pair, max_model_len=32)
    with pytest.raises(ValueError, match="max_model_len"):
        eng.make_request(list(range(10, 42)), SamplingParams())
    with pytest.raises(ValueError, match="token ids"):
        eng.make_request([5, 10**9], SamplingParams())
    with pytest.raises(ValueError, match="empty"):
        eng.make_request([], SamplingParams())


def test_generation_stops_at_max_model_len(pair):
    eng = make(pair, max_model_len=24)
    req = eng.make_request(list(range(100, 110)), SamplingParams(max_tokens=100, temperature=0.0, ignore_eos=True))
    eng.add_request(req)
    while eng.has_unfinished():
        eng.step()
    assert req.finish_reason == "length" and req.num_tokens == 24


def test_stop_strings_cut_text_and_drop_later_tokens(pair):
    eng = make(pair, num_speculative_tokens=5, adaptive_speculation=False)
    greedy = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    full = eng.generate([PROMPTS[0]], greedy)[0]
    text = full.text
    # A stop string that spans token boundaries, taken from the middle of the real output.
    stop = text[len(text) // 3: len(text) // 3 + 6]
    assert stop.strip()
    cut = eng.generate([PROMPTS[0]], SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True, stop=[stop]))[0]
    assert cut.finish_reason == "stop"
    assert cut.text == text[: text.index(stop)]
    assert cut.token_ids == full.token_ids[: len(cut.token_ids)]
    assert cut.stats.completion_tokens == len(cut.token_ids) < len(full.token_ids)
    assert stop in eng.tokenizer.decode(cut.token_ids)  # the last kept token completed the stop string


def test_stop_token_ids_and_eos(pair):
    eng = make(pair)
    greedy = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    full = eng.generate([PROMPTS[1]], greedy)[0].token_ids
    stop_id = full[5]
    first = full.index(stop_id)
    out = eng.generate([PROMPTS[1]], SamplingParams(max_tokens=20, temperature=0.0, stop_token_ids=[stop_id]))[0]
    assert out.token_ids == full[: first + 1] and out.finish_reason == "stop"


def test_detokenizer_deltas_concatenate_and_never_split_characters(pair):
    tok = pair[0].tokenizer
    text = "Grüße 👋🏽 from 東京! naïve café — ∑x² ✓ 🤖🤖"
    ids = tok.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, [])
    deltas = []
    for i in ids:
        delta, stopped = detok.add([i])
        assert stopped is None and "\ufffd" not in delta
        deltas.append(delta)
    deltas.append(detok.flush())
    assert "".join(deltas) == tok.decode(ids, skip_special_tokens=True) == text


def test_logprobs_come_from_the_target(pair):
    target = pair[0]
    # fp32: the reference below is the transformers model in fp32.
    eng = make(pair, num_speculative_tokens=3, adaptive_speculation=False, quantize="none")
    [(req, deltas)] = run_to_end(eng, [PROMPTS[2]], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=3))
    got = [lp for out in deltas for lp in out.logprobs or []]
    assert [lp.token_id for lp in got] == req.output_ids
    ids = torch.tensor([req.all_ids[:-1]])
    with torch.inference_mode():
        ref = torch.log_softmax(target.model(ids).logits[0, len(req.prompt_ids) - 1:].float(), dim=-1)
    for pos, lp in enumerate(got):
        assert lp.logprob == pytest.approx(ref[pos, lp.token_id].item(), abs=1e-4)
        assert len(lp.top) == 3 and lp.top[0][0] == lp.token_id  # greedy: chosen is the top-1
        assert lp.top[0][1] == pytest.approx(ref[pos].max().item(), abs=1e-4)


def test_seeded_sampling_is_reproducible_whatever_the_batch(pair):
    eng = make(pair, num_speculative_tokens=3)
    seeded = SamplingParams(max_tokens=16, temperature=0.9, top_p=0.95, seed=42, ignore_eos=True)
    alone = eng.generate([PROMPTS[0]], seeded)[0].token_ids
    others = SamplingParams(max_tokens=16, temperature=1.0, ignore_eos=True)
    batch = eng.generate(PROMPTS[1:] + [PROMPTS[0]], [others] * 3 + [seeded])
    assert batch[-1].token_ids == alone


def test_fault_in_one_request_leaves_the_others_running(pair, monkeypatch):
    fail_requests_mentioning("BOOM", monkeypatch.setattr)
    eng = make(pair)
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    out = eng.generate([PROMPTS[0], "please BOOM now", PROMPTS[1]], params)
    assert out[1].finish_reason == "error"
    assert [len(c.token_ids) for c in (out[0], out[2])] == [10, 10]
    assert eng.scheduler.kv_usage == 0.0


def test_a_request_that_breaks_its_batch_is_found_by_bisection_not_solo_reruns(pair, monkeypatch):
    """One request among 16 makes every batch it is in raise before the commit. The step that
    failed finds it in 2*log2(16) = 8 smaller runs (the old isolation re-ran all 16 alone: 16
    runs, each a full forward); it alone fails, and every later step runs the 15 others in one
    batch again, with the tokens they would have had without it."""
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    prompts = [f"{PROMPTS[i % 4]} {i}" for i in range(15)]
    expected = [c.token_ids for c in make(pair, max_num_seqs=16, adaptive_speculation=False).generate(prompts, params)]
    sizes = fail_batches_holding("BOOM", monkeypatch.setattr)
    eng = make(pair, max_num_seqs=16, adaptive_speculation=False)
    out = eng.generate(prompts[:7] + ["please BOOM now"] + prompts[7:], params)
    assert out[7].finish_reason == "error"
    assert [c.token_ids for c in out[:7] + out[8:]] == expected
    assert all(c.finish_reason == "length" for c in out[:7] + out[8:])
    first, later = sizes[:sizes.index(15)], sizes[sizes.index(15):]
    assert first[0] == 16 and len(first) <= 1 + 2 * 4, sizes
    # The survivors run together again (fewer as they finish), never split again.
    assert later[0] == 15 and later == sorted(later, reverse=True), sizes
    assert eng.scheduler.kv_usage == 0.0


@pytest.mark.parametrize("method", ["draft", "ngram"])
def test_a_seeded_request_bisected_out_of_a_failing_batch_draws_as_if_alone(pair, method, monkeypatch):
    """A neighbour's fault after the step was planned (the uniforms drawn) makes the engine re-run
    the seeded request's half of the batch: it must draw the same numbers again, so its text is
    the one it has alone (the draws used to be taken from its stream while planning, so the
    re-run drew the next ones). The fault comes at a decode step, where the seeded request's
    drafts are drawn too."""
    seeded = SamplingParams(max_tokens=16, temperature=0.9, top_p=0.95, seed=42, ignore_eos=True)
    prompt = PROMPTS[2] + " " + PROMPTS[2]  # repeats itself: the n-gram lookup finds drafts
    alone = make(pair, method, num_speculative_tokens=3).generate([prompt], seeded)[0].token_ids
    fail_planned_steps_holding("BOOM", monkeypatch.setattr, after_tokens=4)
    eng = make(pair, method, num_speculative_tokens=3)
    out = eng.generate([prompt, "please BOOM now"], [seeded, SamplingParams(max_tokens=16, temperature=1.0)])
    assert out[1].finish_reason == "error"
    assert out[0].token_ids == alone
    assert eng.scheduler.kv_usage == 0.0


async def _collect(aeng: AsyncEngine, prompt, params):
    text, last = "", None
    async for out in aeng.generate(prompt, params):
        text += out.text
        last = out
    return text, last


def test_async_engine_queues_beyond_max_num_seqs_and_aborts(pair):
    eng = make(pair, max_num_seqs=2)
    aeng = AsyncEngine(EngineConfig(), engine=eng)

    async def scenario():
        params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
        tasks = [asyncio.create_task(_collect(aeng, p, params)) for p in PROMPTS + PROMPTS]
        saw_waiting = 0
        while not all(t.done() for t in tasks):
            saw_waiting = max(saw_waiting, aeng.metrics().num_waiting)
            await asyncio.sleep(0.005)
        results = [t.result() for t in tasks]
        assert all(last.finished and last.finish_reason == "length" for _, last in results)
        assert results[0][0] == results[4][0]  # same prompt, same greedy text
        assert saw_waiting > 0

        # Abort: a long stream cancelled by its consumer frees its slot at the next step.
        stream = aeng.add_request(PROMPTS[0], SamplingParams(max_tokens=1000, temperature=0.0, ignore_eos=True))
        async for _ in stream:
            break
        stream.abort()
        for _ in range(400):
            if eng.scheduler.kv_usage == 0.0 and aeng.num_unfinished == 0:
                break
            await asyncio.sleep(0.01)
        assert eng.scheduler.kv_usage == 0.0 and aeng.num_unfinished == 0

    try:
        asyncio.run(scenario())
    finally:
        aeng.shutdown()


def test_a_servers_engine_builds_the_tokenizer_view_in_its_loops_idle_time(pair):
    """Built before ready, llguidance's view of the tokenizer held the GIL through a server's last
    start-up steps (seconds on a large vocabulary); a server's engine leaves it to its loop, which
    builds it once nothing waits. A constrained request is served either way."""
    eng = Engine.from_loaded(EngineConfig(speculative_method="none", adaptive_speculation=False), pair[0],
                             work_when_idle=True)
    assert eng.deferred.owed and eng.grammars.owed  # nothing started it
    aeng = AsyncEngine(EngineConfig(), engine=eng)
    try:
        for _ in range(6000):  # the loop's first idle moment builds it (bounded wait, not a budget)
            if not eng.deferred.owed:
                break
            time.sleep(0.01)
        assert not eng.deferred.owed and not eng.grammars.owed
        assert eng.compile_structured(StructuredOutput(json_schema={"type": "object"})) is not None
    finally:
        aeng.shutdown()


def test_aborted_stream_ends_with_the_engines_abort_output(pair):
    """abort() must not end the stream by itself: the engine's final output (finish_reason
    "abort", with the request's stats) is still delivered, so a reader never waits for an item
    that was dropped (the cause of streams hanging at shutdown)."""
    eng = make(pair)
    aeng = AsyncEngine(EngineConfig(), engine=eng)

    async def scenario():
        stream = aeng.add_request(PROMPTS[0], SamplingParams(max_tokens=1000, temperature=0.0, ignore_eos=True))
        first = await stream.__anext__()
        assert not first.finished
        stream.abort()
        stream.abort()  # idempotent
        outputs = [out async for out in stream]
        assert outputs, "the stream ended without its final output"
        assert all(not out.finished for out in outputs[:-1])
        last = outputs[-1]
        assert last.finished and last.finish_reason == "abort"
        assert last.stats is not None and last.stats.completion_tokens < 1000
        assert aeng.num_unfinished == 0

    try:
        asyncio.run(scenario())
    finally:
        assert aeng.shutdown()


def test_shutdown_waits_for_the_step_in_flight_and_aborts_the_rest(pair, monkeypatch):
    """shutdown() returns only once the loop left its step (never with the thread inside a torch
    call), and streams still open end with finish_reason "abort", not an error."""
    import threading

    eng = make(pair)
    in_step, release = threading.Event(), threading.Event()
    real_step = eng.step

    def held_step():
        in_step.set()
        release.wait()
        return real_step()

    monkeypatch.setattr(eng, "step", held_step)
    aeng = AsyncEngine(EngineConfig(), engine=eng)

    async def scenario():
        stream = aeng.add_request(PROMPTS[0], SamplingParams(max_tokens=1000, temperature=0.0, ignore_eos=True))
        assert await asyncio.to_thread(in_step.wait, 60)
        stopper = asyncio.create_task(asyncio.to_thread(aeng.shutdown))
        # The thread is held inside its step: shutdown must still be waiting, whatever the timeout.
        assert not await asyncio.to_thread(aeng.shutdown, 0.2)
        assert not stopper.done()
        release.set()
        assert await stopper
        outputs = [out async for out in stream]
        assert outputs[-1].finished and outputs[-1].finish_reason == "abort" and outputs[-1].error is None
        with pytest.raises(EngineDeadError):
            aeng.add_request(PROMPTS[0], SamplingParams())

    asyncio.run(scenario())


def test_dead_engine_loop_is_visible(pair, monkeypatch):
    eng = make(pair)
    aeng = AsyncEngine(EngineConfig(), engine=eng)

    def broken_step():
        raise RuntimeError("scheduler exploded")

    monkeypatch.setattr(eng, "step", broken_step)

    async def scenario():
        _, last = await _collect(aeng, PROMPTS[0], SamplingParams(max_tokens=5))
        assert last.finish_reason == "error" and "scheduler exploded" in last.error
        assert not aeng.is_healthy
        with pytest.raises(EngineDeadError):
            aeng.add_request(PROMPTS[0], SamplingParams())

    asyncio.run(scenario())
