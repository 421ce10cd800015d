"""The step costs an engine starts with: from the cache when an earlier start saved them, else
measured (bounded) and saved.

Without adaptive speculation nothing reads them. With speculation off it still runs (target only,
a few seconds): its forwards over every batch shape are the warm-up that makes the first full
batch as fast as the later ones (measured: a server that skipped it decoded 16 requests 15%
slower for the whole run, the allocator's state after large frees being the likely cause), so a
cache hit still runs every shape once, untimed.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from specdec_core.engine.config import EngineConfig
from specdec_core.execution import gguf_kernels
from specdec_core.execution.device_profile import DeviceProfile
from specdec_core.execution.model_runner import ModelRunner
from specdec_core.loading.progress_log import phase
from specdec_core.speculation.calibration import calibrate, warm_up
from specdec_core.speculation.cost_cache import CostCache, machine, model_identity
from specdec_core.speculation.step_costs import StepCostModel

if TYPE_CHECKING:
    from specdec_core.loading.loader import LoadedModel

log = logging.getLogger("specdec.engine")


def step_costs(config: EngineConfig, target: ModelRunner, draft: ModelRunner | None, target_model: LoadedModel,
               draft_model: LoadedModel | None, profile: DeviceProfile, tokens_per_seq: int) -> tuple[StepCostModel, CostCache | None]:
    """The costs of this configuration on this machine (``calibration.calibrate``), and the cache
    they are kept in (None without adaptive speculation)."""
    if not config.adaptive_speculation:
        return StepCostModel.constant(draft is not None), None
    shape = (target, draft, config.max_num_seqs, tokens_per_seq, config.max_model_len)
    # the C kernels run the block layers (gguf) and the row-wise ops (CPU float32): a new build or set, new costs
    c_kernels = profile.kernels == "gguf" or profile.row_kernels
    cache = CostCache(config.cache_dir, {
        "target": model_identity(target_model.path),
        "draft": model_identity(draft_model.path) if draft_model is not None else None,
        "quantize": profile.kernels,
        "kernels": gguf_kernels.build() if c_kernels else None,
        "kernel_set": gguf_kernels.active_kernels() if c_kernels else None,
        "attention": profile.attention, "path": target.path,
        "dtype": str(profile.dtype), "device": profile.device.type, "machine": machine(),
        "max_num_seqs": config.max_num_seqs, "tokens_per_seq": tokens_per_seq, "max_model_len": config.max_model_len,
        "draft_vocab_size": config.draft_vocab_size if draft_model is not None else None})
    cached = cache.load()
    if cached is not None:
        with phase(log, "warming up the step shapes (step costs from the cache)"):
            ran = warm_up(*shape)  # type: ignore[arg-type]
        log.info("step costs loaded from the cache %s (corrected by %d real steps so far; %d step shapes "
                 "warmed up): %s", cache.path, cached.observed_steps, ran, cached.describe())
        return cached, cache
    with phase(log, "calibrating: timing target and draft steps for the speculation policy"):
        costs = calibrate(*shape)  # type: ignore[arg-type]
    cache.save(costs)
    log.info("step costs measured (no cache for this configuration) and saved to %s", cache.path)
    return costs, cache
