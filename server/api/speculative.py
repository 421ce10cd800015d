"""The ``speculative`` report every API's answer carries beside its usage: how much speculation
helped this request. One builder, so the four APIs cannot count it differently."""

from __future__ import annotations

from collections.abc import Iterable

from server.api import response_types as rt
from specdec_core.engine.outputs import RequestStats


def speculative_summary(method: str, stats: Iterable[RequestStats | None]) -> rt.Speculative:
    """The ``speculative`` object: a request's choices' counters summed by the engine's own
    ``RequestStats.total``, the ratios read from it (defined once in ``specdec_core.engine.stats``)."""
    total = RequestStats.total(stats)
    return {
        "method": method,
        "draft_tokens": total.draft_tokens,
        "accepted_tokens": total.accepted_tokens,
        "steps": total.verify_steps,
        "acceptance_rate": total.acceptance_rate,
        "mean_accepted_length": total.mean_accepted_length,
    }
