"""Timing the step shapes at start-up: the measured tables a ``StepCostModel`` starts from, and
the warm-up that runs the same shapes once, untimed, when the costs came from the cache.

A step's cost is a measurement of this machine, not a constant, so the engine times both models
over every step shape it can produce, on its own runners, in KV blocks no request holds, and
interpolates between them (``step_costs``): target steps of ``n`` tokens in all, draft forwards of
``n`` requests, every row with ``CALIBRATION_CONTEXT`` cached tokens; a verify step and a draft row
also at ``LONG_CONTEXT`` cached tokens, for what each cached token adds to a row (``_per_context``).

Each table ends with one more point past the step shapes: a prefill of ``CALIBRATION_CONTEXT``
tokens of one request (timed while giving the shapes their cached tokens). A draft cache that
lagged is caught up in one forward over every token since the draft model last ran, hundreds of
rows; extending the decode shapes' last segment priced that at nothing (a calibration here had
3 and 4 requests at 27.0 ms each, so 150 rows "cost" 27 ms; the 0.5B prefills ~5 ms a
token), and at 4 streams ``auto`` then caught requests up for a draft token or two.

The first calibration is bounded (``CALIBRATION_BUDGET_S``): the small shapes are timed first,
and every shape the budget leaves out gets the timed ones' extrapolation. A start whose costs
came from the cache still runs every shape once (``warm_up``): those forwards are what make the
first full batch as fast as the later ones. Both are steps a server takes one forward at a time
while idle, after its ready line (``Calibration``, ``WarmUp``; ``engine.startup_costs``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Generator, Iterator

import torch

from specdec_core.execution.forward_plan import ForwardItem
from specdec_core.execution.kv_cache import blocks_for
from specdec_core.execution.model_runner import ModelRunner
from specdec_core.speculation.cost_table import CostTable
from specdec_core.speculation.step_costs import StepCostModel

log = logging.getLogger("specdec.step_costs")

CALIBRATION_CONTEXT = 128  # cached tokens per request while timing (a short chat turn)
# Distinct block tables the calibration fills with that context; more requests share them (the
# same work per row). Filling one per request took 29 of a 30 s budget at 16 streams, so most
# shapes were timed once instead of CALIBRATION_REPEATS times (3 tokens: 105 ms, 2 tokens: 58).
CALIBRATION_TABLES = 4
# Rounds over the shapes; each shape keeps its fastest run. With 3, five calibrations of the default
# pair on one quiet 2-core machine put 6 tokens at 1.52-2.30x one token and 16 at 4.25-5.39x; with
# 9, four put them at 1.48-1.71x and 3.87-4.46x, for ~12 s more on the first start only (the table
# is cached). The shape decides where drafts pay at several streams (docs/speculation-measurements.md,
# "the calibration's shape").
CALIBRATION_REPEATS = 9
# The second context the cost of a row's cached tokens is timed at (``_per_context``), if the
# model's length allows one at least MIN_CONTEXT_SPAN past CALIBRATION_CONTEXT.
LONG_CONTEXT = 2048
MIN_CONTEXT_SPAN = 256
# Seconds the first calibration may take (measured here: ~16 s for the default pair on a quiet
# machine, 204 s on a busy one before this cap); shapes not timed by then are extrapolated.
CALIBRATION_BUDGET_S = 30.0
# Seconds the warm-up of a start whose costs came from the cache may take: on a busy machine every
# forward is many times slower (measured here at load 9 on 2 cores: all 11 shapes of SmolLM2 took
# 30 s), and a start that found its costs should not pay that again.
WARM_UP_BUDGET_S = 5.0


def _grid(limit: int) -> list[int]:
    """1, 2, 3, 4, 6, 8, 12, 16, ... up to ``limit`` (inclusive): dense where steps are common."""
    points, n = [1, 2, 3], 4
    while n < limit:
        points += [n, n * 3 // 2]
        n *= 2
    return sorted({p for p in points if p < limit} | {limit})


def calibrate(target: ModelRunner, draft: ModelRunner | None, max_seqs: int, max_tokens_per_seq: int,
              max_len: int, budget_s: float = CALIBRATION_BUDGET_S, repeats: int = CALIBRATION_REPEATS) -> StepCostModel:
    """Time the step shapes this engine can produce, on its own runners, before any request runs
    (every block of their pools is free): a whole ``Calibration`` at once."""
    return Calibration(target, draft, max_seqs, max_tokens_per_seq, max_len, budget_s=budget_s, repeats=repeats).run()


def calibration_blocks(block_size: int, max_len: int, max_tokens_per_seq: int) -> tuple[int, int]:
    """The fewest and the most KV blocks a calibration writes: one block table (a request of
    ``CALIBRATION_CONTEXT`` cached tokens and a step's rows), and ``CALIBRATION_TABLES`` of them
    or the long context of ``_per_context`` where that is more."""
    per = blocks_for(min(CALIBRATION_CONTEXT + max_tokens_per_seq, max_len), block_size)
    return per, max(CALIBRATION_TABLES * per, blocks_for(min(LONG_CONTEXT + max_tokens_per_seq, max_len), block_size))


class Calibration:
    """A calibration, one forward at a time (``advance``): a first start times the shapes
    speculation needs first (``has_required``), serves on the ``provisional`` costs they give, and
    runs the rest while the engine is idle (``engine.startup_costs``); ``run`` does it all at once.

    It writes only into ``blocks`` (default: every block of the pools, free before any request
    runs); no prefix is recorded for them, so nothing leaks into requests. Bounded by ``budget_s``
    of its own forwards: after the shapes every table needs (``_REQUIRED``), a shape is timed only
    while time is left; the small shapes come first. Untimed shapes get the timed ones' inter- or
    extrapolation."""

    def __init__(self, target: ModelRunner, draft: ModelRunner | None, max_seqs: int, max_tokens_per_seq: int,
                 max_len: int, blocks: list[int] | None = None, budget_s: float = CALIBRATION_BUDGET_S,
                 repeats: int = CALIBRATION_REPEATS) -> None:
        self.target, self.draft, self.max_len = target, draft, max_len
        self.budget_s, self.repeats, self.per_seq = budget_s, repeats, max_tokens_per_seq
        self.blocks = list(range(target.cache.num_blocks)) if blocks is None else blocks
        self.bench = _Bench(max_len, max_tokens_per_seq)
        self.tables = _tables(self.blocks, target.cache.block_size, max_seqs, self.bench.context + max_tokens_per_seq)
        self.shapes = _shapes(target, draft, self.tables, max_tokens_per_seq, self.bench.context)
        self.timed: dict[str, dict[int, float]] = {"target": {}, "draft": {}}
        self.per_context: dict[str, tuple[float, float]] = {}  # role: (a row's, a request's) per cached token
        self.spent = 0.0  # seconds of its own forwards: what the budget counts
        self.result: StepCostModel | None = None
        self._forwards = self._run()

    @property
    def has_required(self) -> bool:
        """The shapes every table needs are timed: ``provisional`` has a slope and a draft scale."""
        return all(n in self.timed[role] for role, n in _REQUIRED if role == "target" or self.draft is not None)

    def advance(self) -> bool:
        """Run the next forward (a fill, a warm-up or a timed one); True once ``result`` is set."""
        if self.result is None:
            t0 = time.perf_counter()
            next(self._forwards, None)
            self.spent += time.perf_counter() - t0
        return self.result is not None

    def run(self) -> StepCostModel:
        while not self.advance():
            pass
        assert self.result is not None
        return self.result

    def provisional(self) -> StepCostModel:
        """Costs from the shapes timed so far (at least ``_REQUIRED``), the others extrapolated,
        without the context term (not timed yet)."""
        return self._model()

    def _run(self) -> Iterator[None]:
        """The forwards in order, a yield after each."""
        # Rounds over the grid, each shape's fastest run kept: on a shared machine a slow spell of a
        # few seconds over one shape's back-to-back runs made 1 token as dear as 6 (here, at c=4:
        # 125 ms for 1-6 tokens, pooled), and the table keeps its shape for good (``rescale``).
        for rnd in range(self.repeats):
            for role, runner, n, items in self.shapes:
                timed = self.timed[role]
                if (rnd and n not in timed) or ((role, n) not in _REQUIRED and self.spent > self.budget_s):
                    continue
                if not rnd:
                    self.bench.fill(runner, self.tables[:len(items)])
                    yield
                    runner.forward(items)  # warm-up: first calls of a shape allocate
                    yield
                timed[n] = min(timed.get(n, float("inf")), _seconds(runner, items))
                yield
        for warm in (self.target, self.draft):  # a runner that filled one table only timed it cold: once more, warm
            if warm is not None and len(self.bench.prefills.get(id(warm), [])) == 1:
                self.bench.time_prefill(warm, self.tables[0])
                yield
        for role, model, rows in (("target", self.target, self.per_seq), ("draft", self.draft, 1)):
            if model is not None:
                self.per_context[role] = yield from _per_context(model, rows, self.bench.context, self.max_len,
                                                                 self.repeats, self.blocks)
        self.result = self._model()
        done = len(self.timed["target"]) + len(self.timed["draft"])
        log.info("step costs measured in %.1f s of forwards (cap %.0f s; %d of %d shapes timed%s; %.1f s of it "
                 "giving the requests their %d cached tokens): %s", self.spent, self.budget_s, done, len(self.shapes),
                 "" if done == len(self.shapes) else ", the others extrapolated",
                 self.bench.fill_seconds, self.bench.context, self.result.describe())

    def _model(self) -> StepCostModel:
        def table(role: str, runner: ModelRunner) -> CostTable:
            """Every grid size: timed, else extrapolated, never below a smaller size's cost (noise in
            two close timings must not extrapolate to a cost that falls, or turns negative); and the
            cost of longer contexts."""
            sizes = sorted(n for r, _, n, _ in self.shapes if r == role)
            seconds, floor = [], 0.0
            for n in sizes:
                value = self.timed[role].get(n)
                if value is None:
                    value = max(_extrapolate(self.timed[role], n), floor)
                floor = max(floor, value)
                seconds.append(value)
            per_row, per_request = self.per_context.get(role, (0.0, 0.0))
            fills = self.bench.prefills.get(id(runner))
            if fills and self.bench.context > sizes[-1]:
                # its rows had 0 .. context-1 cached tokens; a table's rows have ``context`` each
                sizes.append(self.bench.context)
                seconds.append(min(fills) + per_row * self.bench.context * (self.bench.context + 1) / 2)
            return CostTable(sizes, seconds, per_row, self.bench.context, per_request_context=per_request,
                             grid_requests=len(self.tables))

        return StepCostModel(table("target", self.target),
                             table("draft", self.draft) if self.draft is not None else None)


def _per_context(runner: ModelRunner, rows: int, short: int, max_len: int, repeats: int,
                 blocks: list[int]) -> Generator[None, None, tuple[float, float]]:
    """Seconds each cached token adds to each row, and to each request once (``CostTable``): one
    request of 1 token and one of ``rows`` tokens (a verify step's; a draft forward has one row
    per request), each timed at ``short`` and at ``LONG_CONTEXT`` cached tokens (a yield after each
    forward). A request's rows share its key reads, so 1 row costs a + b a cached token and
    ``rows`` rows a + rows x b. The keys are whatever the first of ``blocks`` hold (their values
    do not change the work), so the long context costs no prefill: four more shapes (two for one
    row a request), ~3 s for the default pair."""
    bs = runner.cache.block_size
    long = min(LONG_CONTEXT, max_len - rows - 1, len(blocks) * bs - rows)
    if long - short < MIN_CONTEXT_SPAN:
        return 0.0, 0.0
    table = blocks[:blocks_for(long + rows, bs)]
    counts = sorted({1, rows})
    shapes = [[ForwardItem(table, context, [1] * n, n, num_drafts=n - 1)] for n in counts for context in (short, long)]
    # Interleaved, as the grid's rounds: the term is a difference of two timings (back to back,
    # the same draft row gave +0.00 and +4.83 ms per 1K in two calibrations a minute apart).
    best = [float("inf")] * len(shapes)
    for items in shapes:
        runner.forward(items)
        yield
    for _ in range(repeats):
        for i, items in enumerate(shapes):
            best[i] = min(best[i], _seconds(runner, items))
            yield
    one = max((best[1] - best[0]) / (long - short), 0.0)  # a + b
    if rows == 1:
        return one, 0.0
    many = max((best[3] - best[2]) / (long - short), 0.0)  # a + rows x b
    per_row = min(max((many - one) / (rows - 1), 0.0), many / rows)
    return per_row, max(one - per_row, 0.0)


def _extrapolate(timed: dict[int, float], n: int) -> float:
    """An untimed size's cost: interpolated between timed sizes, and past the largest one along the
    slope from the smallest to the largest (steadier than the last segment's slope when two close
    timings on a busy machine disagree); one timed size: proportional to it."""
    sizes = sorted(timed)
    if n < sizes[-1] or len(sizes) == 1:
        return CostTable(sizes, [timed[m] for m in sizes])(n)
    slope = (timed[sizes[-1]] - timed[sizes[0]]) / (sizes[-1] - sizes[0])
    return timed[sizes[-1]] + slope * (n - sizes[-1])


def warm_up(target: ModelRunner, draft: ModelRunner | None, max_seqs: int, max_tokens_per_seq: int,
            max_len: int, budget_s: float = WARM_UP_BUDGET_S) -> int:
    """Run every step shape once, untimed, over empty caches (costs came from the cache, so no
    request needs a cached context): every batch size the calibration (``calibrate``) would have
    run passes through the linear layers and the head once before requests do, smallest first, for
    at most ``budget_s``. Returns how many shapes ran."""
    t0 = time.perf_counter()
    warm = WarmUp(target, draft, max_seqs, max_tokens_per_seq, list(range(target.cache.num_blocks)))
    while time.perf_counter() - t0 <= budget_s and not warm.advance():
        pass
    return warm.ran


def warm_up_blocks(block_size: int, max_tokens_per_seq: int) -> tuple[int, int]:
    """The fewest and the most KV blocks a ``WarmUp`` writes (one table, or one per request it
    places apart)."""
    per = blocks_for(max_tokens_per_seq, block_size)
    return per, CALIBRATION_TABLES * per


class WarmUp:
    """``warm_up`` one shape at a time (``advance``; True once every shape ran), writing only into
    ``blocks``: a server runs it while idle (``engine.startup_costs``)."""

    def __init__(self, target: ModelRunner, draft: ModelRunner | None, max_seqs: int, max_tokens_per_seq: int,
                 blocks: list[int]) -> None:
        self.blocks = blocks
        tables = _tables(blocks, target.cache.block_size, max_seqs, max_tokens_per_seq)
        self._shapes = iter(_shapes(target, draft, tables, max_tokens_per_seq, context=0))
        self.ran = 0

    def advance(self) -> bool:
        shape = next(self._shapes, None)
        if shape is None:
            return True
        shape[1].forward(shape[3])
        self.ran += 1
        return False


# The shapes a calibration times whatever its budget: two target points give the table a slope,
# one draft point its scale.
_REQUIRED = {("target", 1), ("target", 2), ("draft", 1)}


class _Bench:
    """Gives the block tables a shape uses ``CALIBRATION_CONTEXT`` cached tokens, each once and
    only when a shape first needs it (a bounded calibration does not pay for tables it never uses),
    and keeps each runner's times of those forwards: the fastest is the tables' prefill point.

    Only a runner's first table is prefilled; the others get a copy of its blocks. A row's work
    does not depend on what its cached keys and values hold, only on how many there are, and a
    prefill per table was ~11 s of the default pair's first calibration (8 prefills of 128
    tokens, 33.5 s in all, on the 2-core AVX2 machine)."""

    def __init__(self, max_len: int, max_tokens_per_seq: int) -> None:
        self.context = max(min(CALIBRATION_CONTEXT, max_len - max_tokens_per_seq - 1), 0)
        self.filled: dict[int, list[list[int]]] = {}  # id(runner) -> tables filled, in order
        self.prefills: dict[int, list[float]] = {}  # id(runner) -> seconds of each fill timed
        self.fill_seconds = 0.0

    def fill(self, runner: ModelRunner, tables: list[list[int]]) -> None:
        filled = self.filled.setdefault(id(runner), [])
        if not self.context:
            return
        blocks = blocks_for(self.context, runner.cache.block_size)
        for table in tables:
            if table in filled:
                continue
            if filled:
                runner.cache.copy_blocks(filled[0][:blocks], table[:blocks])
            else:
                self.time_prefill(runner, table)
            filled.append(table)

    def time_prefill(self, runner: ModelRunner, table: list[int]) -> None:
        seconds = _seconds(runner, [ForwardItem(table, 0, [1] * self.context, 1)])
        self.fill_seconds += seconds
        self.prefills.setdefault(id(runner), []).append(seconds)


def _tables(blocks: list[int], block_size: int, max_seqs: int, tokens: int) -> list[list[int]]:
    """A block table of ``tokens`` positions per calibration request, runs of consecutive
    ``blocks`` (as a request gets them on an idle pool; the draft's pool has the same blocks).
    Requests share tables where the blocks are too few for all: the timing is the same."""
    per = blocks_for(tokens, block_size)
    fit = max(min(len(blocks) // per, CALIBRATION_TABLES), 1)
    return [blocks[(s % fit) * per:(s % fit + 1) * per] for s in range(max_seqs)]


def _shapes(target: ModelRunner, draft: ModelRunner | None, tables: list[list[int]], per_seq: int,
            context: int) -> list[tuple[str, ModelRunner, int, list[ForwardItem]]]:
    """Every shape to time, most needed first: one request's steps (1 token, then with drafts) and
    one draft forward, then the batched ones. A target step of n tokens is laid out as the engine
    would: up to ``len(tables)`` requests, each 1 known token followed by drafts."""
    max_seqs = len(tables)
    shapes = []
    for n in _grid(max_seqs * per_seq):
        seqs = min(max_seqs, n)
        lengths = [n // seqs + (1 if s < n % seqs else 0) for s in range(seqs)]
        shapes.append(("target", target, n, [ForwardItem(tables[s], context, [1] * m, m, num_drafts=m - 1)
                                             for s, m in enumerate(lengths)]))
    if draft is not None:
        shapes += [("draft", draft, n, [ForwardItem(tables[s], context, [1], 1) for s in range(n)]) for n in _grid(max_seqs)]
    return sorted(shapes, key=lambda shape: (shape[2] > per_seq, shape[2], shape[0]))


def _seconds(runner: ModelRunner, items: list[ForwardItem]) -> float:
    """One timed forward (callers keep the fastest of several: another process taking the CPU
    only ever adds time, so the minimum is the shape's own cost; the median let one busy moment
    double it; what the load adds while serving is learned from real steps)."""
    cuda = runner.device.type == "cuda"
    if cuda:  # time the device's work, not the launches: nothing queued before, all of it done after
        torch.cuda.synchronize(runner.device)
    t0 = time.perf_counter()
    runner.forward(items)
    if cuda:
        torch.cuda.synchronize(runner.device)
    return time.perf_counter() - t0
