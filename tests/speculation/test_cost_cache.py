"""Step costs cached between starts: a second start with the same configuration loads them (and
says so), another configuration measures its own, real steps correct the live tables, and the
first calibration keeps to its budget. Nothing here depends on how fast the machine is."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from specdec_core import Engine, EngineConfig, SamplingParams
from specdec_core.speculation.calibration import calibrate
from specdec_core.speculation.cost_cache import CostCache
from specdec_core.speculation.cost_table import SHAPE_BOUND, SHAPE_RATE, CostTable, non_decreasing
from specdec_core.speculation.step_costs import StepCostModel
from tests.helpers.models import load
from tests.helpers.runners import slot_runner


@pytest.fixture(scope="module")
def pair(tiny_target, tiny_draft):
    return load(tiny_target), load(tiny_draft, role="draft")


def start(pair, cache_dir: Path, caplog: pytest.LogCaptureFixture, **kw) -> tuple[Engine, str]:
    """An engine with adaptive speculation (so it needs step costs) and what it logged about them."""
    caplog.clear()
    cfg = EngineConfig(speculative_method="draft", num_speculative_tokens=2, seed=0, quantize=kw.pop("quantize", "none"),
                       max_num_seqs=kw.pop("max_num_seqs", 2), max_model_len=160, cache_dir=cache_dir, **kw)
    with caplog.at_level(logging.INFO, logger="specdec"):
        eng = Engine.from_loaded(cfg, *pair)
    return eng, caplog.text


def test_a_second_start_loads_the_costs_the_first_measured(pair, tmp_path: Path, caplog) -> None:
    first, logged = start(pair, tmp_path, caplog)
    assert "step costs measured (no cache for this configuration)" in logged
    assert first.step_costs.cache is not None and first.step_costs.cache.path.is_file()
    assert first.step_costs.cache.path.parent == tmp_path / "step-costs"
    second, logged = start(pair, tmp_path, caplog)
    assert "step costs loaded from the cache" in logged and "step costs measured" not in logged
    assert second.step_costs.costs.target_table == first.step_costs.costs.live_target
    assert second.step_costs.costs.draft_table == first.step_costs.costs.live_draft


def test_another_configuration_measures_its_own(pair, tmp_path: Path, caplog) -> None:
    first, _ = start(pair, tmp_path, caplog)
    other, logged = start(pair, tmp_path, caplog, max_num_seqs=3)
    assert "step costs measured" in logged and "loaded from the cache" not in logged
    assert other.step_costs.cache is not None and first.step_costs.cache is not None
    assert other.step_costs.cache.path != first.step_costs.cache.path
    assert sorted(p.name for p in (tmp_path / "step-costs").iterdir()) == sorted(
        [first.step_costs.cache.path.name, other.step_costs.cache.path.name])


@pytest.mark.parametrize("quantize", ["gguf", "int8"])
def test_costs_belong_to_the_kernel_build_that_timed_them(pair, tmp_path: Path, caplog, monkeypatch, quantize) -> None:
    """A new build of the C kernels can change a step's cost 2x (their thread pool did), so its
    costs are timed anew rather than read from another build's file: in gguf (the block layers)
    and in every CPU float32 mode (the row-wise ops and one-row attention)."""
    from specdec_core.kernels import c_library

    first, _ = start(pair, tmp_path, caplog, quantize=quantize)
    assert first.step_costs.cache is not None and c_library.build() == first.step_costs.cache.key["kernels"]
    monkeypatch.setattr(c_library, "build", lambda: "another-build")
    rebuilt, logged = start(pair, tmp_path, caplog, quantize=quantize)
    assert "step costs measured" in logged and rebuilt.step_costs.cache is not None
    assert rebuilt.step_costs.cache.path != first.step_costs.cache.path


def test_real_steps_move_the_live_costs_and_reach_the_cache(pair, tmp_path: Path, caplog) -> None:
    eng, _ = start(pair, tmp_path, caplog)
    frozen = (list(eng.step_costs.costs.target_table.seconds), list(eng.step_costs.costs.draft_table.seconds))  # type: ignore[union-attr]
    eng.generate(["Once upon a time", "def f(x):"], SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))
    assert eng.step_costs.costs.observed_steps > 0
    assert eng.step_costs.costs.live_target.seconds != frozen[0]
    assert (eng.step_costs.costs.target_table.seconds, eng.step_costs.costs.draft_table.seconds) == frozen  # type: ignore[union-attr]
    eng.step_costs.save()
    assert eng.step_costs.cache is not None
    saved = json.loads(eng.step_costs.cache.path.read_text())
    costs = eng.step_costs.costs
    assert saved["observed_steps"] == costs.observed_steps and saved["target"]["seconds"] == costs.live_target.seconds
    again, logged = start(pair, tmp_path, caplog)
    assert f"corrected by {eng.step_costs.costs.observed_steps} real steps" in logged
    assert again.step_costs.costs.target_table.seconds == eng.step_costs.costs.live_target.seconds


def test_the_table_learns_the_level_and_keeps_the_measured_shape() -> None:
    """Real steps rescale every size alike: a size the policy stopped choosing is never left
    behind at a cost no step corrects (bucket by bucket, a 2-token step at 157 ms against 76 ms for
    3 tokens kept ``auto`` from ever drafting one token)."""
    costs = StepCostModel(CostTable([1, 2, 4, 8], [1.0, 1.0, 2.0, 4.0]), None)
    for _ in range(200):
        costs.observe_target(8, 8.0)
    assert costs.target(8) == pytest.approx(8.0, rel=1e-3)
    assert costs.live_target.seconds == pytest.approx([2.0, 2.0, 4.0, 8.0], rel=1e-3)
    assert costs.target(8, frozen=True) == 4.0
    for _ in range(200):
        costs.observe_target(2, 1.0)  # only 2-token steps run now, at half the cost
    assert costs.live_target.seconds == pytest.approx([1.0, 1.0, 2.0, 4.0], rel=1e-3)


def test_one_stalled_step_moves_the_level_by_a_bounded_step() -> None:
    """A step held up by something else (here 100x its cost) is one sample, not the machine's new
    speed: the level moves by at most 10% of ``OBSERVED_RATIO_BOUND`` - 1, and the size's
    correction by at most ``SHAPE_RATE`` of it; the draft table's level as the target's."""
    costs = StepCostModel(CostTable([1, 8], [1.0, 2.0]), CostTable([1, 4], [0.5, 1.0]))
    costs.observe_target(8, 200.0)
    assert costs.target(8) == pytest.approx(2.0 * 1.1 * (1 + SHAPE_RATE), rel=1e-6)
    assert costs.target(1) == pytest.approx(1.1, rel=1e-6)
    costs.observe_draft([(1, 0.0)], 50.0)  # the draft model's forwards likewise
    assert costs.draft(1) == pytest.approx(0.5 * 1.1, rel=1e-6)


def test_a_size_that_runs_dearer_than_the_level_says_is_corrected_within_a_bound(tmp_path: Path) -> None:
    """Served code_edit at 4 streams ran its 4-row steps 4% over the table and its 8-row ones 12%
    over: one level learns the mix, and each size's correction the rest, within ``SHAPE_BOUND``,
    while a size that never runs keeps following the level. The corrections are saved; a file
    from before them reads as 1 each."""
    costs = StepCostModel(CostTable([1, 4, 8], [1.0, 2.0, 4.0]), None)
    for step in range(400):
        n = 8 if step % 5 == 0 else 4
        costs.observe_target(n, (1.12 if n == 8 else 1.04) * costs.target(n, frozen=True))
    assert costs.target(4) == pytest.approx(2 * 1.04, rel=0.02)
    assert costs.target(8) == pytest.approx(4 * 1.12, rel=0.02)
    assert 1.04 < costs.target(1) < 1.12  # the level: the mix's average, ~1.056
    assert costs.live_target.correction[0] == 1.0
    cache = CostCache(tmp_path, {"model": "a"})
    cache.save(costs)
    loaded = cache.load()
    assert loaded is not None and loaded.target(8) == costs.target(8) and loaded.target_table == costs.live_target
    data = json.loads(cache.path.read_text())
    del data["target"]["correction"]
    cache.path.write_text(json.dumps(data))
    older = cache.load()
    assert older is not None and older.target_table.correction == [1.0, 1.0, 1.0]
    for step in range(400):  # an 8-row step three times dearer than its shape: the bound holds
        n = 8 if step % 5 == 0 else 4
        costs.observe_target(n, (3.0 if n == 8 else 1.0) * costs.target(n, frozen=True))
    assert costs.live_target.correction[2] == SHAPE_BOUND
    assert costs.target(8) / costs.live_target(4, corrected=False) == pytest.approx(2 * SHAPE_BOUND, rel=1e-6)


def test_the_first_calibration_keeps_to_its_budget(pair, caplog) -> None:
    target = slot_runner(pair[0].model, 4, 160, vocab_size=49152)
    draft = slot_runner(pair[1].model, 4, 160, vocab_size=49152)
    with caplog.at_level(logging.INFO, logger="specdec"):
        costs = calibrate(target, draft, 4, 3, 160, budget_s=0.0, repeats=1)
    # A spent budget still times the required shapes (target 1 and 2 tokens, a 1-request draft);
    # every other grid size is extrapolated from them, never below a smaller size's cost.
    # Past them each table has its prefill point (128 tokens of one request, timed while filling).
    assert costs.target_table.sizes == [1, 2, 3, 4, 6, 8, 12, 128]
    assert costs.draft_table is not None and costs.draft_table.sizes == [1, 2, 3, 4, 128]
    t, d = costs.target_table.seconds[:-1], costs.draft_table.seconds[:-1]
    # The two timed sizes are whatever the machine gave. Timed in order, 3 tokens extend their
    # line; a loaded machine may time 1 token slower than 2, and then the two are pooled
    # (``non_decreasing``). Either way no size costs less than a smaller one.
    if t[0] < t[1]:
        assert t[2] == pytest.approx(t[0] + 2 * (t[1] - t[0]))
    else:
        assert t[0] == pytest.approx(t[1]) and t[2] >= t[1]
    assert all(t[i] >= t[i - 1] for i in range(1, len(t)))
    if costs.draft_table.seconds[-1] >= 4 * d[0]:
        assert d == pytest.approx([d[0] * n for n in (1, 2, 3, 4)])
    else:  # a tiny model's prefill can cost less than 4 x one row: the two are pooled
        assert all(d[i] >= d[i - 1] for i in range(1, 4)) and d[3] == pytest.approx(costs.draft_table.seconds[-1])
    assert "3 of 11 shapes timed, the others extrapolated" in caplog.text and "cap 0 s" in caplog.text


def test_the_calibration_times_what_a_rows_cached_tokens_cost(pair, monkeypatch) -> None:
    """A request of one token and one of a verify step's tokens (and one draft row), timed at the
    calibration's context and at ``LONG_CONTEXT``: what a cached token adds to each row is the
    table's ``per_context``, what it adds to each request once (its keys read for all its rows)
    ``per_request_context``. The timing here is a function of the shape (what matters is which
    shapes are timed and the arithmetic)."""
    from specdec_core.speculation import calibration

    per_token = {"target": 3e-6, "draft": 1e-6}
    per_request = {"target": 5e-6, "draft": 2e-6}

    def fake_seconds(runner, items):
        role = "target" if runner is target else "draft"
        return sum(len(it.tokens) * (0.01 + per_token[role] * it.start) + per_request[role] * it.start for it in items)

    target = slot_runner(pair[0].model, 2, 4096, vocab_size=49152)
    draft = slot_runner(pair[1].model, 2, 4096, vocab_size=49152)
    monkeypatch.setattr(calibration, "_seconds", fake_seconds)
    costs = calibrate(target, draft, 2, 3, 4096, repeats=1)
    assert costs.target_table.per_context == pytest.approx(3e-6)
    assert costs.target_table.per_request_context == pytest.approx(5e-6)
    assert costs.target_table.grid_requests == 2
    # a draft forward has one row a request: its slope is one term
    assert costs.draft_table is not None and costs.draft_table.per_context == pytest.approx(3e-6)
    assert costs.draft_table.per_request_context == 0.0
    assert costs.target_table.context == costs.draft_table.context == calibration.CALIBRATION_CONTEXT
    # 3 rows of one request with 2,000 cached tokens, against 3 at the calibration's 128 (timed as
    # two requests, the grid's most: the third row a draft of one of them)
    assert (costs.target(3, context_tokens=3 * 2000, request_context=2000) - costs.target(3)
            == pytest.approx(3 * 1872 * 3e-6 + (2000 - 2 * 128) * 5e-6))
    # the same rows as their own requests (no request_context): every row reads its keys
    assert costs.target(2, context_tokens=2 * 2000) - costs.target(2) == pytest.approx(2 * 1872 * 8e-6)
    assert "+5.12 ms a request" in costs.describe()
    # where the model is too short for a second context, the term is 0
    short = calibrate(slot_runner(pair[0].model, 2, 160, vocab_size=49152), None, 2, 3, 160, repeats=1)
    assert short.target_table.per_context == 0.0


def test_a_draft_catch_up_is_priced_as_the_prefill_it_is(pair, monkeypatch) -> None:
    """A lagging draft cache is caught up in one forward of every token since the draft last ran:
    hundreds of rows. Decode shapes here cost the same for 1 to 4 requests (as a calibration of
    the default pair at 4 streams gave: 3 and 4 requests at 27.0 ms), so extending their last
    segment priced 150 rows at one row's cost. The calibration's fills time a 128-token prefill,
    and the tables end with it."""
    from specdec_core.speculation import calibration

    def fake_seconds(runner, items):  # decode: 20 ms whatever the rows; a prefill: 2 ms a token
        return 0.02 if all(len(it.tokens) == 1 for it in items) else sum(0.002 * len(it.tokens) for it in items)

    target = slot_runner(pair[0].model, 4, 160, vocab_size=49152)
    draft = slot_runner(pair[1].model, 4, 160, vocab_size=49152)
    monkeypatch.setattr(calibration, "_seconds", fake_seconds)
    costs = calibrate(target, draft, 4, 1, 160, repeats=1)
    assert costs.draft(4) == pytest.approx(0.02)
    assert costs.draft(128) == pytest.approx(0.256)
    assert costs.draft(1 + 150) > 0.9 * 150 * 0.002  # the decode shapes alone: 0.02
    # the tables are filled once per distinct table: at most CALIBRATION_TABLES of them
    big = slot_runner(pair[0].model, 16, 160, vocab_size=49152)
    tables = calibration._tables(list(range(big.cache.num_blocks)), big.cache.block_size, 16, 160)
    assert len({tuple(t) for t in tables}) == calibration.CALIBRATION_TABLES < 16


def test_one_table_is_prefilled_and_the_others_get_copies_of_its_blocks(pair) -> None:
    """A row's work depends on how many cached tokens it attends, not on their values: each runner
    pays one prefill of the calibration's context, and its other tables hold copies of its rows."""
    import torch

    from specdec_core.execution.kv_cache import token_rows
    from specdec_core.speculation import calibration

    target = slot_runner(pair[0].model, 4, 160, vocab_size=49152)
    tables = calibration._tables(list(range(target.cache.num_blocks)), target.cache.block_size, 4, 160)[:3]
    bench = calibration._Bench(160, 3)
    bench.fill(target, tables)
    assert len(bench.prefills[id(target)]) == 1 and bench.context == calibration.CALIBRATION_CONTEXT
    cache, rows = target.cache, bench.context
    first = torch.tensor(token_rows(tables[0], cache.block_size, 0, rows))
    assert cache.keys[0][:, first].abs().sum() > 0  # the prefill wrote them
    for table in tables[1:]:
        other = torch.tensor(token_rows(table, cache.block_size, 0, rows))
        assert not set(other.tolist()) & set(first.tolist())
        assert all(torch.equal(layer[:, other], layer[:, first]) for layer in (*cache.keys, *cache.values))


def test_a_rows_cached_tokens_are_rescaled_with_the_level_and_kept_in_the_cache(tmp_path: Path) -> None:
    costs = StepCostModel(CostTable([1, 4], [1.0, 2.0], per_context=0.001, context=100), None)
    twice = 2 * costs.target(4, context_tokens=4 * 600)  # a machine at half the speed
    for _ in range(200):
        costs.observe_target(4, twice, context_tokens=4 * 600)
    assert costs.live_target.seconds == pytest.approx([2.0, 4.0], rel=1e-3)
    assert costs.live_target.per_context == pytest.approx(0.002, rel=1e-3)
    cache = CostCache(tmp_path, {"model": "a"})
    cache.save(costs)
    loaded = cache.load()
    assert loaded is not None and loaded.target_table == costs.live_target


def test_a_cache_of_another_key_format_or_broken_is_ignored(tmp_path: Path, caplog) -> None:
    cache = CostCache(tmp_path, {"model": "a"})
    cache.save(StepCostModel(CostTable([1, 2], [1.0, 2.0]), None))
    assert cache.load() is not None and cache.load().target_table.seconds == [1.0, 2.0]  # type: ignore[union-attr]
    data = json.loads(cache.path.read_text())
    cache.path.write_text(json.dumps({**data, "key": {"model": "b"}}))
    assert cache.load() is None and "another configuration" in caplog.text
    cache.path.write_text(json.dumps({**data, "format": data["format"] - 1}))
    assert cache.load() is None and f"this version reads {data['format']}" in caplog.text
    cache.path.write_text(json.dumps({**data, "target": {"sizes": [2, 1], "seconds": [1.0, -1.0]}}))
    assert cache.load() is None
    for correction in ([1.0], [1.0, 2 * SHAPE_BOUND]):  # one per size, within the bound
        cache.path.write_text(json.dumps({**data, "target": {**data["target"], "correction": correction}}))
        assert cache.load() is None
    cache.path.write_text("{not json")
    assert cache.load() is None


def test_a_first_start_serves_on_provisional_costs_and_calibrates_while_idle(pair, tmp_path: Path, caplog) -> None:
    """A server's first start times only the shapes speculation needs first; the rest runs one
    forward at a time while no request is waiting or running, in blocks lent by the scheduler,
    and requests served meanwhile (and the prefix cache's blocks) are untouched by it."""
    cfg = EngineConfig(speculative_method="draft", num_speculative_tokens=2, seed=0, quantize="none",
                       max_num_seqs=2, max_model_len=160, cache_dir=tmp_path)
    caplog.set_level(logging.INFO, logger="specdec")
    eng = Engine.from_loaded(cfg, *pair, work_when_idle=True)
    costs, pool, pending = eng.step_costs.costs, eng.scheduler.pool, eng.step_costs.pending
    assert pending is not None and "step costs provisional" in caplog.text and not eng.step_costs.cache.path.exists()
    assert pool.num_free == pool.num_blocks - len(pending.blocks) and costs.target_table.sizes[:2] == [1, 2]
    assert eng.scheduler.kv_usage == 0.0  # the gauge counts requests' blocks, not the lent ones
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    prompt = "def fibonacci(n):\n    if n < 2:\n        return n\n    return " * 3
    first = eng.generate([prompt], params)[0]
    eng.add_request(eng.make_request(prompt, params))
    assert not eng.deferred.run_one()  # a request waits: no calibration
    while eng.has_unfinished():
        eng.step()
    for _ in range(10):  # some of it, between requests
        assert eng.deferred.run_one()
    again = eng.generate([prompt], params)[0]
    assert again.token_ids == first.token_ids and again.stats.cached_tokens > 0
    while eng.deferred.run_one():
        pass
    assert eng.step_costs.pending is None and pending.result is not None and "measured while idle" in caplog.text
    assert eng.step_costs.costs is costs and costs.target_table == pending.result.target_table  # the policy's object
    assert costs.observed_steps == 0 and pool.num_free == pool.num_blocks
    saved = eng.step_costs.cache.load()
    assert saved is not None and saved.target_table == costs.target_table
    assert eng.generate([prompt], params)[0].token_ids == first.token_ids
    # A later start loads them, and warms its step shapes up while idle, in lent blocks too.
    later = Engine.from_loaded(cfg, *pair, work_when_idle=True)
    warming, pool = later.step_costs.pending, later.scheduler.pool
    assert warming is not None and not later.step_costs.provisional and "warmed up while the engine is idle" in caplog.text
    assert later.step_costs.costs.target_table == saved.target_table and pool.num_free == pool.num_blocks - len(warming.blocks)
    while later.deferred.run_one():
        pass
    assert "step shapes warmed up while idle" in caplog.text and pool.num_free == pool.num_blocks


def test_a_calibration_that_fails_while_idle_leaves_the_engine_serving_on_provisional_costs(pair, tmp_path: Path,
                                                                                            caplog, monkeypatch) -> None:
    """A forward of the calibration raising after ready (a fault injected: the real runners do not
    fail) is logged; its blocks go back, the provisional costs stay and are never saved."""
    cfg = EngineConfig(speculative_method="draft", num_speculative_tokens=2, seed=0, quantize="none",
                       max_num_seqs=2, max_model_len=160, cache_dir=tmp_path)
    caplog.set_level(logging.INFO, logger="specdec")
    eng = Engine.from_loaded(cfg, *pair, work_when_idle=True)
    pool, pending = eng.scheduler.pool, eng.step_costs.pending
    assert pending is not None

    def broken(items):
        raise RuntimeError("injected")

    for runner in (eng.target, eng.draft_runner):
        monkeypatch.setattr(runner, "forward", broken)
    while "the calibration failed" not in caplog.text:  # the next forward raises (a yield may come first)
        assert eng.deferred.run_one()
    monkeypatch.undo()
    assert eng.step_costs.pending is None and eng.step_costs.provisional and pool.num_free == pool.num_blocks
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    assert len(eng.generate(["Once upon a time"], params)[0].token_ids) == 4
    eng.step_costs.save()
    assert eng.step_costs.cache is not None and not eng.step_costs.cache.path.exists()


def test_a_restarted_server_says_where_its_costs_came_from(tiny_target, tiny_draft, tmp_path: Path) -> None:
    from tests.helpers.servers import ServerProcess, serving, tiny_args

    args = [a for a in tiny_args(tiny_target, tiny_draft) if a != "--no-adaptive-speculation"]
    env = {"SPECDEC_CACHE_DIR": str(tmp_path / "cache")}
    with serving(ServerProcess(args, tmp_path / "first.log", env=env)) as first:
        assert "step costs provisional (no cache for this configuration)" in first.logs()
        first.wait_log("step costs measured while idle (no cache for this configuration) and saved")
    with serving(ServerProcess(args, tmp_path / "second.log", env=env)) as second:
        logs = second.logs()
        assert "step costs loaded from the cache" in logs and "step costs measured" not in logs


def test_a_table_never_says_a_bigger_step_costs_less() -> None:
    assert CostTable([1, 2, 3, 4], [67.1, 85.4, 81.5, 98.0]).seconds == pytest.approx([67.1, 83.45, 83.45, 98.0])
    assert non_decreasing([3.0, 2.0, 1.0, 5.0]) == pytest.approx([2.0, 2.0, 2.0, 5.0])
    assert non_decreasing([1.0, 1.0, 2.0]) == [1.0, 1.0, 2.0]
