"""The speculation statistics have one definition: the response, the log and Prometheus agree."""

from __future__ import annotations

from types import SimpleNamespace

from server.api.speculative import speculative_summary
from server.prometheus import EngineCollector
from specdec_core.engine.outputs import RequestStats
from specdec_core.engine.stats import EngineMetrics, acceptance_rate, mean_accepted_length


def test_request_stats_total_sums_choices_and_skips_unfinished() -> None:
    a = RequestStats(prompt_tokens=3, completion_tokens=10, draft_tokens=8, accepted_tokens=6, verify_steps=4,
                     accepted_histogram=[1, 0, 3])
    b = RequestStats(prompt_tokens=3, completion_tokens=5, draft_tokens=4, accepted_tokens=1, verify_steps=4,
                     accepted_histogram=[3, 1])
    total = RequestStats.total([a, None, b])
    assert (total.completion_tokens, total.draft_tokens, total.accepted_tokens, total.verify_steps) == (15, 12, 7, 8)
    assert total.accepted_histogram == [4, 1, 3]
    assert total.acceptance_rate == acceptance_rate(7, 12) == 7 / 12
    assert total.mean_accepted_length == mean_accepted_length(15, 8) == 15 / 8


def test_speculative_object_reads_the_engine_stats() -> None:
    a = RequestStats(completion_tokens=9, draft_tokens=6, accepted_tokens=3, verify_steps=5)
    spec = speculative_summary("draft", [a])
    assert spec == {"method": "draft", "draft_tokens": 6, "accepted_tokens": 3, "steps": 5,
                    "acceptance_rate": a.acceptance_rate, "mean_accepted_length": a.mean_accepted_length}
    off = speculative_summary("none", [None])
    assert off["acceptance_rate"] == 0.0 and off["mean_accepted_length"] == 0.0


def test_prometheus_rate_matches_engine_metrics() -> None:
    m = EngineMetrics(total_draft_tokens=40, total_accepted_tokens=30, accepted_histogram=[1, 2])
    engine = SimpleNamespace(is_healthy=True, metrics=lambda: m)
    families = {f.name: f for f in EngineCollector(lambda: engine, lambda: "m").collect()}
    sample = families["specdec_spec_decode_acceptance_rate"].samples[0]
    assert sample.value == m.acceptance_rate == 0.75 and sample.labels == {"model_name": "m"}
