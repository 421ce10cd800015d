"""Engine-wide counters, read by the server's /metrics without touching the engine's internals."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class EngineMetrics:
    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0
    total_prompt_tokens: int = 0
    total_generation_tokens: int = 0
    total_draft_tokens: int = 0
    total_accepted_tokens: int = 0
    total_steps: int = 0
    total_step_seconds: float = 0.0
    total_draft_seconds: float = 0.0
    total_target_seconds: float = 0.0
    total_finished: int = 0
    total_failed: int = 0
    # accepted_histogram[j]: verify passes (over all requests) that accepted j drafts.
    accepted_histogram: list[int] = field(default_factory=list)

    @property
    def acceptance_rate(self) -> float:
        return self.total_accepted_tokens / self.total_draft_tokens if self.total_draft_tokens else 0.0
