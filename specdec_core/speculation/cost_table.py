"""One model's forward time by step size: a measured table that real steps keep correcting.

A table is the shape measured at start-up (what n rows cost against one, at a fixed cached
context), times a level that every observed step moves (a loaded machine, longer contexts), times
a bounded correction per size that only the steps at or next to that size move.

The level is one factor for every size: corrected size by size without a bound, a table drifted
with whichever sizes happened to run at long contexts (on the default pair at c=1, after ~40,000
steps over several starts: 2 tokens 157 ms, 3 tokens 76 ms, 1 token 69 ms), and a size made too
dear was never chosen again, so never corrected (4 and 5 tokens stayed at 146-157 ms: ``auto``
stopped drafting past 2 tokens). The per-size correction is what one factor cannot learn: the
calibration times n requests of one row each at 128 cached tokens, but at 4 streams a 7- or
8-row step is four requests verifying drafts at code contexts, and a served code_edit run put
those 11-12% over the table while its 580 four-row steps ran 4% over (docs/speculation-measurements.md,
"Each step size priced on its own"). The level learns from the uncorrected shape, so it is the traffic's average and
a slower machine moves it rather than the correction of whichever size runs; each correction
learns its size's cost against that level and stays within ``SHAPE_BOUND`` of the measured
shape, so a size it made dear is at most that much dearer than measured and keeps following the
level.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

SCALE_DECAY = 0.9  # weight of the old level when a real step is observed
SHAPE_RATE = 0.05  # weight of one observed step in its size's correction
SHAPE_BOUND = 1.25  # a size's correction stays within [1 / SHAPE_BOUND, SHAPE_BOUND]
# One observed step counts as at most this many times (or this fraction of) what the table says: a
# step stalled by something else (a GC pause, another process, a thread holding the GIL) moved the
# level by 10% of its whole ratio, x14 for a 4 s stall of a 30 ms step. A real change of speed
# still arrives, at up to x1.1 a step.
OBSERVED_RATIO_BOUND = 2.0


def _bounded(ratio: float) -> float:
    return min(max(ratio, 1.0 / OBSERVED_RATIO_BOUND), OBSERVED_RATIO_BOUND)


def non_decreasing(values: list[float]) -> list[float]:
    """The closest non-decreasing sequence in least squares: runs that decrease become their mean."""
    runs: list[list[float]] = []  # [sum, count]
    for v in values:
        runs.append([v, 1])
        while len(runs) > 1 and runs[-2][0] * runs[-1][1] > runs[-1][0] * runs[-2][1]:
            total, count = runs.pop()
            runs[-1][0] += total
            runs[-1][1] += count
    return [total / count for total, count in runs for _ in range(int(count))]


@dataclass
class CostTable:
    """Seconds of one forward at grid sizes, each row a request of its own with ``context`` cached
    tokens (as the grid is timed); linear between points, linear past the last one.

    A step's cached tokens cost twice over (at the agentic workload's 2-3K tokens a row attends to
    20x the keys it had at calibration): ``per_context``, what every cached token adds to each row
    (its own scores and values), and ``per_request_context``, what every cached token adds to each
    request once, whatever its rows (its keys read: the rows of a request, a verify step's known
    token and drafts, are attended together and read each key tile once). So a request's drafts
    cost their rows' work, not more reads; priced per row, as one term, a draft row at 2K tokens
    cost ~1.7x what it does (AMD EPYC Zen 4, the 1.5B: 1 row +4.2 us a cached token, 5 rows of
    one request +7.5 us). ``correction``: each size's factor on top of ``seconds`` (empty: 1 each)."""

    sizes: list[int]
    seconds: list[float]
    per_context: float = 0.0
    context: int = 0
    correction: list[float] = field(default_factory=list)
    per_request_context: float = 0.0
    # The most requests a grid point was timed with (0: as many as its rows); past it, a point's
    # rows were laid out as drafts of that many requests (``calibration._shapes``).
    grid_requests: int = 0
    _points: list[float] = field(init=False, repr=False, compare=False, default_factory=list)

    def __post_init__(self) -> None:
        # A bigger step never costs less. Timing noise can say so (the fastest of three runs, on
        # the default pair here: 2 tokens 85.4 ms, 3 tokens 81.5 ms), and with the shape kept for
        # good (``rescale``) a policy would prefer the larger step for ever: such neighbours are
        # replaced by their mean (pool adjacent violators). The corrected points are kept so too.
        self.seconds = non_decreasing(self.seconds)
        self.correction = list(self.correction) or [1.0] * len(self.sizes)
        self._update()

    def _update(self) -> None:
        self._points = non_decreasing([s * c for s, c in zip(self.seconds, self.correction)])

    def __call__(self, n: float, context_tokens: float | None = None, corrected: bool = True,
                 request_context: float | None = None) -> float:
        """``n`` rows whose cached tokens add up to ``context_tokens`` (None: ``context`` each),
        from requests whose cached tokens add up to ``request_context`` (None: every row a request
        of its own, as the grid was timed); ``corrected=False``: the measured shape at the level,
        without the sizes' corrections."""
        base = self._interpolate(self._points if corrected else self.seconds, n)
        if context_tokens is None:
            return base
        more = self.per_context * (context_tokens - n * self.context)
        if self.per_request_context:
            timed_with = min(n, self.grid_requests) if self.grid_requests else n
            requests = context_tokens if request_context is None else request_context
            more += self.per_request_context * (requests - timed_with * self.context)
        return max(base + more, 0.0)

    def _interpolate(self, secs: list[float], n: float) -> float:
        sizes = self.sizes
        if n <= sizes[0]:
            return secs[0] * max(n, 0) / sizes[0]
        if len(sizes) == 1:
            return secs[0] * n / sizes[0]
        i = min(bisect.bisect_left(sizes, n), len(sizes) - 1)  # past the end: extend the last segment
        lo, hi = i - 1, i
        slope = (secs[hi] - secs[lo]) / (sizes[hi] - sizes[lo])
        return secs[lo] + slope * (n - sizes[lo])

    def copy(self) -> "CostTable":
        return CostTable(list(self.sizes), list(self.seconds), self.per_context, self.context, list(self.correction),
                         self.per_request_context, self.grid_requests)

    def rescale(self, ratio: float) -> None:
        """A real forward cost ``ratio`` times what the measured shape at the level says: move
        every point and the context term toward it by the same factor (an exponential moving
        average of the level; the shape stays). Bounded as ``observe`` is: one draft forward
        stalled by something else once moved the draft level x2.2, and a draft model priced
        that dear is not chosen again, so never observed to correct it (and the cache kept it)."""
        self._move_level(_bounded(ratio))
        self._update()

    def observe(self, n: float, seconds: float, context_tokens: float | None = None,
                request_context: float | None = None) -> bool:
        """A real forward of ``n`` rows took ``seconds``: the level learns from the uncorrected
        shape, so it is the traffic's average and a slower machine is the level's to learn, not
        the correction of the one size that happens to run (every other size would look cheap);
        then the sizes around ``n`` learn what is left. False where the table predicts nothing
        to compare with."""
        level = self(n, context_tokens, corrected=False, request_context=request_context)
        predicted = self(n, context_tokens, request_context=request_context)
        if level <= 0 or predicted <= 0 or seconds <= 0:
            return False
        factor = self._move_level(_bounded(seconds / level))
        self._correct(n, _bounded(seconds / (predicted * factor)))  # the level moved every term by ``factor``
        self._update()
        return True

    def _move_level(self, ratio: float) -> float:
        factor = 1.0 + (1.0 - SCALE_DECAY) * (ratio - 1.0)
        self.seconds = [s * factor for s in self.seconds]
        self.per_context *= factor
        self.per_request_context *= factor
        return factor

    def _correct(self, n: float, ratio: float) -> None:
        """Move the correction of the grid sizes around ``n`` toward ``ratio`` (observed over
        corrected prediction), each by its share of the interpolation, within ``SHAPE_BOUND``.
        Each converges to its size's cost against the level."""
        i = bisect.bisect_left(self.sizes, n)
        if i == 0 or i == len(self.sizes) or self.sizes[i] == n:
            shares = {min(i, len(self.sizes) - 1): 1.0}
        else:
            upper = (n - self.sizes[i - 1]) / (self.sizes[i] - self.sizes[i - 1])
            shares = {i - 1: 1.0 - upper, i: upper}
        for j, share in shares.items():
            moved = self.correction[j] * (1.0 + SHAPE_RATE * share * (ratio - 1.0))
            self.correction[j] = min(max(moved, 1.0 / SHAPE_BOUND), SHAPE_BOUND)
