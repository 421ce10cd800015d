"""What a step costs: measured target and draft forward times as a function of the step's size.

Speculation pays only when the tokens it adds are cheap, and on this hardware "cheap" is a
measurement, not a constant: a 1.5B int8 target scores 5 tokens of one request for ~1.07x one
token, but 16 requests x 5 tokens for ~4.4x 16 x 1 (every draft token is attended on its own, see
``native_llama``). So the engine times both models at start-up over the step shapes it can
produce and interpolates between them:

- ``target(n)``: one decode step whose requests feed ``n`` tokens in all (known + drafts);
- ``draft(n)``: one draft forward of ``n`` requests (a draft position of a step).

Start-up costs are measured at a fixed cached context, so they say nothing about what else is
running; ``observe_*`` then scales them by what real steps cost (longer contexts, a loaded
machine). Requests whose choice must not depend on other requests use ``frozen`` costs only.
"""

from __future__ import annotations

import bisect
import logging
import statistics
import time
from dataclasses import dataclass, field

import torch

from specdec_core.engine.step_plan import ScheduledRequest
from specdec_core.execution.model_runner import ForwardItem, ModelRunner

log = logging.getLogger("specdec.cost_model")

CALIBRATION_CONTEXT = 128  # cached tokens per request while timing (a short chat turn)
CALIBRATION_REPEATS = 3
SCALE_DECAY = 0.9  # weight of the old scale when a real step is observed


def _grid(limit: int) -> list[int]:
    """1, 2, 3, 4, 6, 8, 12, 16, ... up to ``limit`` (inclusive): dense where steps are common."""
    points, n = [1, 2, 3], 4
    while n < limit:
        points += [n, n * 3 // 2]
        n *= 2
    return sorted({p for p in points if p < limit} | {limit})


@dataclass
class CostTable:
    """Seconds of one forward at grid sizes; linear between points, linear past the last one."""

    sizes: list[int]
    seconds: list[float]

    def __call__(self, n: float) -> float:
        sizes, secs = self.sizes, self.seconds
        if n <= sizes[0]:
            return secs[0] * max(n, 0) / sizes[0]
        if len(sizes) == 1:
            return secs[0] * n / sizes[0]
        i = min(bisect.bisect_left(sizes, n), len(sizes) - 1)  # past the end: extend the last segment
        lo, hi = i - 1, i
        slope = (secs[hi] - secs[lo]) / (sizes[hi] - sizes[lo])
        return secs[lo] + slope * (n - sizes[lo])


@dataclass
class StepCostModel:
    """Measured step costs (``frozen``) and their live scale factors (``target``/``draft``)."""

    target_table: CostTable
    draft_table: CostTable | None
    target_scale: float = 1.0
    draft_scale: float = 1.0
    observed_steps: int = field(default=0)

    def target(self, n: int, frozen: bool = False) -> float:
        return self.target_table(n) * (1.0 if frozen else self.target_scale)

    def draft(self, n: float, frozen: bool = False) -> float:
        if self.draft_table is None:
            return 0.0
        return self.draft_table(n) * (1.0 if frozen else self.draft_scale)

    def observe_target(self, n: int, seconds: float) -> None:
        """A real decode step scored ``n`` tokens in ``seconds``: move the live scale toward it."""
        predicted = self.target_table(n)
        if predicted > 0 and seconds > 0:
            self.target_scale = SCALE_DECAY * self.target_scale + (1 - SCALE_DECAY) * seconds / predicted
            self.observed_steps += 1

    def observe_draft(self, forwards: list[int], seconds: float) -> None:
        """Real draft forwards of ``forwards[j]`` requests each took ``seconds`` in all."""
        if self.draft_table is None:
            return
        predicted = sum(self.draft_table(n) for n in forwards)
        if predicted > 0 and seconds > 0:
            self.draft_scale = SCALE_DECAY * self.draft_scale + (1 - SCALE_DECAY) * seconds / predicted

    def describe(self) -> str:
        def row(table: CostTable) -> str:
            return " ".join(f"{n}:{s * 1e3:.1f}" for n, s in zip(table.sizes, table.seconds))

        text = f"target ms by tokens {{{row(self.target_table)}}}"
        if self.draft_table is not None:
            text += f"; draft ms by requests {{{row(self.draft_table)}}}"
        return text

    @classmethod
    def constant(cls, has_draft: bool, draft_ratio: float = 0.4) -> "StepCostModel":
        """Costs without timing anything: a flat target and a draft at ``draft_ratio`` of it. For
        engines that cannot afford calibration (tests); the live scales still adapt."""
        return cls(CostTable([1], [1.0]), CostTable([1], [draft_ratio]) if has_draft else None)


def calibrate(target: ModelRunner, draft: ModelRunner | None, max_seqs: int, max_tokens_per_seq: int,
              max_len: int, block_size: int) -> StepCostModel:
    """Time the step shapes this engine can produce, on its own runners (writes into free blocks
    of their pools before any request runs; no prefix is recorded for them, so nothing leaks
    into requests)."""
    context = max(min(CALIBRATION_CONTEXT, max_len - max_tokens_per_seq - 1), 0)
    t0 = time.perf_counter()
    runners = [target] + ([draft] if draft is not None else [])
    tables = _tables(target, max_seqs, context + max_tokens_per_seq, block_size)
    if context:
        for runner in runners:
            for table in tables:
                runner.forward([ForwardItem(table, 0, [1] * context, 1)])
    target_table = _time_target(target, tables, max_tokens_per_seq, context)
    draft_table = _time_draft(draft, tables, context) if draft is not None else None
    model = StepCostModel(target_table, draft_table)
    log.info("step costs measured in %.1f s: %s", time.perf_counter() - t0, model.describe())
    return model


def _tables(runner: ModelRunner, max_seqs: int, tokens: int, block_size: int) -> list[list[int]]:
    """A block table of ``tokens`` positions per calibration request: consecutive blocks, as a
    request gets them on an idle pool (requests share tables where the pool is too small for
    all: the timing is the same)."""
    per = -(-tokens // block_size)
    fit = max(runner.cache.num_blocks // per, 1)
    return [list(range((s % fit) * per, (s % fit + 1) * per)) for s in range(max_seqs)]


def _time_target(runner: ModelRunner, tables: list[list[int]], per_seq: int, context: int) -> CostTable:
    """A step of n tokens is laid out as the engine would: up to ``max_seqs`` requests, each 1
    known token followed by drafts."""
    max_seqs = len(tables)
    sizes = _grid(max_seqs * per_seq)
    seconds = []
    for n in sizes:
        seqs = min(max_seqs, n)
        lengths = [n // seqs + (1 if s < n % seqs else 0) for s in range(seqs)]
        items = [ForwardItem(tables[s], context, [1] * m, m, num_drafts=m - 1) for s, m in enumerate(lengths)]
        seconds.append(_median_seconds(runner, items))
    return CostTable(sizes, seconds)


def _time_draft(runner: ModelRunner, tables: list[list[int]], context: int) -> CostTable:
    sizes = _grid(len(tables))
    seconds = [_median_seconds(runner, [ForwardItem(tables[s], context, [1], 1) for s in range(n)]) for n in sizes]
    return CostTable(sizes, seconds)


def _median_seconds(runner: ModelRunner, items: list[ForwardItem]) -> float:
    cuda = runner.device.type == "cuda"
    runner.forward(items)  # warm-up: first calls of a shape allocate
    times = []
    for _ in range(CALIBRATION_REPEATS):
        if cuda:  # time the device's work, not the launches: nothing queued before, all of it done after
            torch.cuda.synchronize(runner.device)
        t0 = time.perf_counter()
        runner.forward(items)
        if cuda:
            torch.cuda.synchronize(runner.device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def observe_step(costs: StepCostModel, items: list[ScheduledRequest], draft_s: float, target_s: float, max_draft_rows: int) -> None:
    """Let a decode-only step (``ScheduledRequest`` items) correct the live cost model; prefill
    chunks are not a shape the model describes."""
    if any(it.num_new != 1 for it in items):
        return
    costs.observe_target(sum(1 + it.num_drafts for it in items), target_s)
    drafting = [it for it in items if it.source == "draft"]
    depth = max((it.num_drafts for it in drafting), default=0)
    # A draft cache that lagged (the request used n-gram lookups meanwhile) is caught up in
    # this step's first draft forward: a prefill, not a shape the draft table describes.
    caught_up = max((it.request.num_computed + it.num_new - it.request.draft_computed for it in drafting), default=0)
    if depth and caught_up <= max_draft_rows:
        costs.observe_draft([sum(1 for it in drafting if it.num_drafts >= j) for j in range(1, depth + 1)], draft_s)
