"""The step costs an engine runs on: from the cache when an earlier start saved them, else
measured (bounded) and saved.

Without adaptive speculation nothing reads them. With speculation off it still runs (target only,
a few seconds): its forwards over every batch shape are the warm-up that makes the first full
batch as fast as the later ones (measured: a server that skipped it decoded 16 requests 15%
slower for the whole run, the allocator's state after large frees being the likely cause), so a
cache hit still runs every shape once, untimed.

A first start (no cache) of a server does not wait for the whole calibration: it was 26 of the
default pair's ~60 s to ready on a 2-core machine. It times the shapes speculation needs first
(one and two target tokens, one draft row: ``Calibration.has_required``), becomes ready on the
provisional costs they give, and runs the rest one forward at a time while no request is waiting
or running (``idle_work``), in KV blocks it borrows from the scheduler (the prefix cache forgets
what they held) and gives back when done; then the measured tables replace the provisional ones
and are saved. A request that arrives meanwhile waits for at most one of its forwards. A later
start's warm-up (the costs came from the cache) runs the same way, after the ready line, so
requests that come at once run before it (the 15% above was a server that never ran it).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from specdec_core.engine.config import EngineConfig
from specdec_core.engine.scheduler import Scheduler
from specdec_core.execution.device_profile import DeviceProfile
from specdec_core.execution.kv_cache import blocks_for
from specdec_core.execution.model_runner import ModelRunner
from specdec_core.kernels import c_library
from specdec_core.loading.progress_log import phase
from specdec_core.speculation.calibration import Calibration, WarmUp, calibration_blocks, warm_up, warm_up_blocks
from specdec_core.speculation.cost_cache import CostCache, machine
from specdec_core.speculation.scheduled_request import ScheduledItems
from specdec_core.speculation.step_costs import StepCostModel, observe_step

if TYPE_CHECKING:
    from specdec_core.loading.loader import LoadedModel

log = logging.getLogger("specdec.engine")


class EngineCosts:
    """The step cost model (``costs``: one object for the engine's life, read by the policy), the
    cache it is saved in (None without adaptive speculation), and the forwards still owed while
    idle (``pending``: the rest of a calibration, or the warm-up of a start whose costs came from
    the cache), in blocks borrowed from ``scheduler``."""

    def __init__(self, costs: StepCostModel, cache: CostCache | None, pending: Calibration | WarmUp | None = None,
                 scheduler: Scheduler | None = None) -> None:
        self.costs, self.cache, self.pending, self.scheduler = costs, cache, pending, scheduler
        # never saved: until the calibration replaces them
        self.provisional = isinstance(pending, Calibration)

    def observe(self, items: ScheduledItems, draft_s: float, target_s: float, max_draft_rows: int) -> None:
        """A real step corrects the live tables; measured ones are saved now and then."""
        observe_step(self.costs, items, draft_s, target_s, max_draft_rows)
        if self.cache is not None and not self.provisional:
            self.cache.save_later(self.costs)

    def idle_work(self) -> bool:
        """One forward of the calibration or warm-up still owed (``DeferredStartup`` calls it only
        while no request is waiting or running); False when none is owed."""
        pending, scheduler = self.pending, self.scheduler
        if pending is None or scheduler is None:
            return False
        try:
            done = pending.advance()
        except Exception:  # the server is serving already: it goes on with the costs it has
            log.exception("the %s failed; serving on the step costs it has%s", "calibration" if self.provisional
                          else "warm-up", " (provisional: not saved)" if self.provisional else "")
            scheduler.give_back(pending.blocks)
            self.pending = None
            return True
        if done and isinstance(pending, WarmUp):
            scheduler.give_back(pending.blocks)
            self.pending = None
            log.info("step shapes warmed up while idle (%d shapes)", pending.ran)
        elif done:
            assert isinstance(pending, Calibration) and pending.result is not None and self.cache is not None
            self.costs.replace(pending.result)
            scheduler.give_back(pending.blocks)
            self.pending, self.provisional = None, False
            self.cache.save(self.costs)
            log.info("step costs measured while idle (no cache for this configuration) and saved to %s: they "
                     "replace the provisional ones", self.cache.path)
        return True

    def save(self) -> None:
        """Write the step costs real steps have corrected (when the engine stops); provisional
        ones are not saved: the next start calibrates again."""
        if self.cache is not None and not self.provisional:
            self.cache.save(self.costs)


def step_costs(config: EngineConfig, target: ModelRunner, draft: ModelRunner | None, target_model: LoadedModel,
               draft_model: LoadedModel | None, profile: DeviceProfile, tokens_per_seq: int,
               scheduler: Scheduler | None = None) -> EngineCosts:
    """The costs of this configuration on this machine (``calibration``). With ``scheduler``
    (a server's engine), a calibration is finished while idle where the pool can lend its blocks
    and still hold a full-length request; else before this returns."""
    if not config.adaptive_speculation:
        return EngineCosts(StepCostModel.constant(draft is not None), None)
    shape = (target, draft, config.max_num_seqs, tokens_per_seq, config.max_model_len)
    # the C kernels run the block layers (gguf) and the row-wise ops (CPU float32): a new build or set, new costs
    c_kernels = profile.kernels == "gguf" or profile.row_kernels
    cache = CostCache(config.cache_dir, {
        "target": target_model.identity,
        "draft": draft_model.identity if draft_model is not None else None,
        "quantize": profile.kernels,
        "kernels": c_library.build() if c_kernels else None,
        "kernel_set": c_library.active_kernels() if c_kernels else None,
        "attention": profile.attention, "path": target.path,
        "dtype": str(profile.dtype), "device": profile.device.type, "machine": machine(),
        "max_num_seqs": config.max_num_seqs, "tokens_per_seq": tokens_per_seq, "max_model_len": config.max_model_len,
        "draft_vocab_size": config.draft_vocab_size if draft_model is not None else None})
    bs, max_len = target.cache.block_size, config.max_model_len
    assert max_len is not None  # the engine set it from the KV sizing
    full_length = blocks_for(max_len + tokens_per_seq, bs) + 1
    cached = cache.load()
    if cached is not None:
        blocks = scheduler.lend(*warm_up_blocks(bs, tokens_per_seq), keep=full_length) if scheduler else []
        if blocks:
            log.info("step costs loaded from the cache %s (corrected by %d real steps so far; the step shapes are "
                     "warmed up while the engine is idle): %s", cache.path, cached.observed_steps, cached.describe())
            return EngineCosts(cached, cache, WarmUp(target, draft, config.max_num_seqs, tokens_per_seq, blocks), scheduler)
        with phase(log, "warming up the step shapes (step costs from the cache)"):
            ran = warm_up(*shape)  # type: ignore[arg-type]
        log.info("step costs loaded from the cache %s (corrected by %d real steps so far; %d step shapes "
                 "warmed up): %s", cache.path, cached.observed_steps, ran, cached.describe())
        return EngineCosts(cached, cache)
    blocks = scheduler.lend(*calibration_blocks(bs, max_len, tokens_per_seq), keep=full_length) if scheduler else []
    if not blocks:
        with phase(log, "calibrating: timing target and draft steps for the speculation policy"):
            costs = Calibration(*shape).run()  # type: ignore[arg-type]
        cache.save(costs)
        log.info("step costs measured (no cache for this configuration) and saved to %s", cache.path)
        return EngineCosts(costs, cache)
    calibration = Calibration(*shape, blocks=blocks)  # type: ignore[arg-type]
    with phase(log, "calibrating the step shapes speculation needs first"):
        while not calibration.has_required:
            calibration.advance()
    costs = calibration.provisional()
    log.info("step costs provisional (no cache for this configuration), from %d shapes timed: %s; the rest of the "
             "calibration runs while the engine is idle", len(calibration.timed["target"]) +
             len(calibration.timed["draft"]), costs.describe())
    return EngineCosts(costs, cache, calibration, scheduler)
