"""Engine-wide counters, read by the server's /metrics without touching the engine's internals.

The two speculation ratios are defined here once; per-request stats (``RequestStats``), the
engine totals below, the response's ``speculative`` object, the request log and Prometheus all
go through these functions, so no two reports can disagree on what "acceptance rate" means.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def acceptance_rate(accepted_tokens: int, draft_tokens: int) -> float:
    """Accepted / proposed draft tokens; 0.0 when nothing was proposed (speculation off)."""
    return accepted_tokens / draft_tokens if draft_tokens else 0.0


def mean_accepted_length(emitted_tokens: int, verify_steps: int) -> float:
    """Tokens emitted per target verify step (accepted drafts + the target's own token); 1.0 means
    speculation bought nothing, 0.0 that no step ran."""
    return emitted_tokens / verify_steps if verify_steps else 0.0


def count_into(histogram: list[int], value: int, count: int = 1) -> None:
    """``histogram[value] += count``, growing the list as needed (the accepted-length histograms)."""
    if len(histogram) <= value:
        histogram.extend([0] * (value + 1 - len(histogram)))
    histogram[value] += count


@dataclass
class EngineMetrics:
    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0  # share of the KV pool's blocks held by running requests
    # Running requests that gave their blocks back to an older one and were recomputed.
    num_preemptions: int = 0
    total_prompt_tokens: int = 0
    # Prompt tokens taken from the prefix cache instead of being prefilled.
    prefix_cache_hit_tokens: int = 0
    total_generation_tokens: int = 0
    total_draft_tokens: int = 0
    total_accepted_tokens: int = 0
    total_steps: int = 0
    total_step_seconds: float = 0.0
    total_draft_seconds: float = 0.0
    total_target_seconds: float = 0.0
    total_finished: int = 0
    total_failed: int = 0
    # Draft tokens proposed and accepted, per proposer ("draft", "ngram", "suffix").
    draft_tokens_by_source: dict[str, int] = field(default_factory=dict)
    accepted_tokens_by_source: dict[str, int] = field(default_factory=dict)
    # accepted_histogram[j]: verify passes (over all requests) that accepted j drafts.
    accepted_histogram: list[int] = field(default_factory=list)
    # Verify passes whose drafts were a token tree, and the accepted tokens that came from off
    # the tree's first chain (what a linear proposal of the same rows would not have offered).
    tree_passes: int = 0
    tree_branch_tokens: int = 0

    @property
    def acceptance_rate(self) -> float:
        return acceptance_rate(self.total_accepted_tokens, self.total_draft_tokens)

    def record_verify(self, source: str, drafts: int, accepted: int) -> None:
        """One verify pass of ``drafts`` tokens from ``source`` that kept ``accepted`` of them."""
        self.total_draft_tokens += drafts
        self.total_accepted_tokens += accepted
        self.draft_tokens_by_source[source] = self.draft_tokens_by_source.get(source, 0) + drafts
        self.accepted_tokens_by_source[source] = self.accepted_tokens_by_source.get(source, 0) + accepted
        count_into(self.accepted_histogram, accepted)

    def record_step(self, draft_s: float, target_s: float, tree_passes: int = 0, tree_branch_tokens: int = 0) -> None:
        self.total_draft_seconds += draft_s
        self.total_target_seconds += target_s
        self.tree_passes += tree_passes
        self.tree_branch_tokens += tree_branch_tokens
