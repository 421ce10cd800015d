"""What a step costs, as the speculation policy reads it: target and draft forward times as a
function of the step's size and its rows' cached tokens.

Speculation pays only when the tokens it adds are cheap, and on this hardware "cheap" is a
measurement, not a constant: a 1.5B int8 target scores 5 tokens of one request for ~1.07x one
token, but 16 requests x 5 tokens for ~4.4x 16 x 1 (every draft token is attended on its own, see
``native_decoder``). So the policy prices a step from two tables (``calibration`` measures them at
start-up, ``cost_cache`` keeps them between starts):

- ``target(n)``: one decode step whose requests feed ``n`` tokens in all (known + drafts);
- ``draft(n)``: one draft forward of ``n`` requests (a draft position of a step).

Start-up costs are measured at a fixed cached context, so they say nothing about what else is
running; ``observe_step`` then corrects a live copy of each table toward what real steps cost (its
level; the target's also size by size, within a bound: ``cost_table``), and the live tables are what
``cost_cache`` saves for the next start. Requests whose choice must not depend on other requests
use the ``frozen`` tables only, fixed for the engine's lifetime once measured (a first start
serves on provisional tables until its calibration finishes: ``engine.startup_costs``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specdec_core.speculation.cost_table import CostTable
from specdec_core.speculation.scheduled_request import ScheduledItems


@dataclass
class StepCostModel:
    """Step costs: the ``frozen`` tables (as measured or loaded at start) and ``live`` copies that
    real steps keep correcting (``observe_*``)."""

    target_table: CostTable
    draft_table: CostTable | None
    observed_steps: int = 0
    live_target: CostTable = field(init=False)
    live_draft: CostTable | None = field(init=False)

    def __post_init__(self) -> None:
        self.live_target = self.target_table.copy()
        self.live_draft = self.draft_table.copy() if self.draft_table is not None else None

    def replace(self, measured: "StepCostModel") -> None:
        """Take ``measured``'s tables as the frozen ones and start the live ones from them again
        (a first start's calibration finished after it served on provisional costs)."""
        self.target_table, self.draft_table, self.observed_steps = measured.target_table, measured.draft_table, 0
        self.__post_init__()

    def target(self, n: int, frozen: bool = False, context_tokens: float | None = None,
               request_context: float | None = None) -> float:
        """A decode step feeding ``n`` tokens whose rows' cached tokens add up to ``context_tokens``
        and its requests' (each counted once, whatever its rows) to ``request_context``."""
        return (self.target_table if frozen else self.live_target)(n, context_tokens, request_context=request_context)

    def draft(self, n: float, frozen: bool = False, context_tokens: float | None = None) -> float:
        """One draft forward of ``n`` requests with ``context_tokens`` cached tokens in all."""
        table = self.draft_table if frozen else self.live_draft
        return table(n, context_tokens) if table is not None else 0.0

    def observe_target(self, n: int, seconds: float, context_tokens: float | None = None,
                       request_context: float | None = None) -> None:
        """A real decode step scored ``n`` tokens in ``seconds``: move the live table toward it."""
        if self.live_target.observe(n, seconds, context_tokens, request_context):
            self.observed_steps += 1

    def observe_draft(self, forwards: list[tuple[int, float]], seconds: float) -> None:
        """Real draft forwards of ``forwards[j] = (requests, their cached tokens)`` took
        ``seconds`` in all."""
        if self.live_draft is None:
            return
        predicted = sum(self.live_draft(n, ctx) for n, ctx in forwards)
        if predicted > 0 and seconds > 0:
            self.live_draft.rescale(seconds / predicted)

    def describe(self, live: bool = False) -> str:
        def row(table: CostTable) -> str:
            points = " ".join(f"{n}:{s * 1e3:.1f}" for n, s in zip(table.sizes, table.seconds))
            text = (f"{{{points}}} at {table.context} cached tokens a row, "
                    f"+{table.per_context * 1024 * 1e3:.2f} ms a row per 1K more")
            if table.per_request_context:
                text += f" and +{table.per_request_context * 1024 * 1e3:.2f} ms a request"
            return text

        target, draft = (self.live_target, self.live_draft) if live else (self.target_table, self.draft_table)
        text = f"target ms by tokens {row(target)}"
        if draft is not None:
            text += f"; draft ms by requests {row(draft)}"
        return text

    @classmethod
    def constant(cls, has_draft: bool, draft_ratio: float = 0.4) -> "StepCostModel":
        """Costs without timing anything: a flat target and a draft at ``draft_ratio`` of it. For
        engines that cannot afford calibration (tests); the live scales still adapt."""
        return cls(CostTable([1], [1.0]), CostTable([1], [draft_ratio]) if has_draft else None)


def observe_step(costs: StepCostModel, items: ScheduledItems, draft_s: float, target_s: float, max_draft_rows: int) -> None:
    """Let a decode-only step (``ScheduledRequest`` items) correct the live cost model; prefill
    chunks are not a shape the model describes."""
    if any(it.num_new != 1 for it in items):
        return
    costs.observe_target(sum(1 + it.num_drafts for it in items), target_s,
                         sum((1 + it.num_drafts) * it.request.num_computed for it in items),
                         sum(it.request.num_computed for it in items))
    drafting = [it for it in items if it.source == "draft"]
    depth = max((it.num_drafts for it in drafting), default=0)
    # A draft cache that lagged (the request used n-gram lookups meanwhile) is caught up in
    # this step's first draft forward: a prefill, not a shape the draft table describes.
    caught_up = max((it.request.num_computed + it.num_new - it.request.draft_computed for it in drafting), default=0)
    if depth and caught_up <= max_draft_rows:
        forwards = [[it.request.num_computed for it in drafting if it.num_drafts >= j] for j in range(1, depth + 1)]
        costs.observe_draft([(len(f), float(sum(f))) for f in forwards], draft_s)
