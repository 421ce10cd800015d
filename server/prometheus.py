"""Prometheus metrics: latency histograms measured here, engine counters read at scrape time.

Latencies are the client's view, so the server measures them from the arrival of the HTTP request
and the arrival time of each engine delta: time to first token, inter-token latency (a delta that
brings m tokens after a gap g counts m tokens of g/m each: speculative steps emit several tokens at
once) and end-to-end latency. Token and speculation counters are the engine's own cumulative
totals, exported as they are when Prometheus scrapes, so the two can never drift apart.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from specdec_core.engine.stats import acceptance_rate

PREFIX = "specdec"

TTFT_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0, 240.0, 480.0)


QUEUE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0)
PREFILL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)
# Engine metrics carry the served model's name, as vLLM's do, so routers and Prometheus adapters
# that pick replicas by queue depth or cache usage work without relabelling.
MODEL_LABEL = "model_name"


class EngineCollector(Collector):
    """Reads ``engine.metrics()`` on every scrape (nothing while the engine is still loading)."""

    def __init__(self, get_engine: Callable[[], Any], get_model_name: Callable[[], str],
                 get_admitted: Callable[[], int] | None = None) -> None:
        self._get_engine = get_engine
        self._get_model_name = get_model_name
        self._get_admitted = get_admitted

    def collect(self) -> Iterator[Metric]:
        engine = self._get_engine()
        healthy = GaugeMetricFamily(f"{PREFIX}_engine_healthy", "1 while the engine loop runs, else 0")
        healthy.add_metric([], 1.0 if engine is not None and engine.is_healthy else 0.0)
        yield healthy
        if engine is None:
            return
        m, model = engine.metrics(), self._get_model_name()
        running, waiting = m.num_running, m.num_waiting
        if self._get_admitted is not None:
            # Admission's own count, split by what the engine runs: the two gauges add up to what
            # the next request's 429 is decided on (the engine's view lags behind by a step: it
            # still holds requests whose client left, and not yet the ones just submitted).
            admitted = self._get_admitted()
            running = min(running, admitted)
            waiting = admitted - running
        yield _gauge("num_requests_running", "Requests in the running batch", running, model)
        yield _gauge("num_requests_waiting", "Requests admitted and not yet running", waiting, model)
        yield _gauge("kv_cache_usage_perc", "Fraction of KV cache blocks in use (0-1)", m.kv_cache_usage, model)
        yield _counter("num_preemptions", "Requests preempted (their KV blocks given to an older request) and recomputed",
                       m.num_preemptions, model)
        yield _counter("prompt_tokens", "Prompt tokens processed", m.total_prompt_tokens, model)
        yield _counter("prefix_cache_hits", "Prompt tokens served from the prefix cache (not prefilled)",
                       m.prefix_cache_hit_tokens, model)
        yield _counter("generation_tokens", "Tokens generated", m.total_generation_tokens, model)
        yield _counter("engine_steps", "Engine steps (draft + verify rounds)", m.total_steps, model)
        yield _counter("spec_decode_num_draft_tokens", "Draft tokens proposed", m.total_draft_tokens, model)
        yield _counter("spec_decode_num_accepted_tokens", "Draft tokens accepted by the target", m.total_accepted_tokens, model)
        # Computed from the totals (not ``m.acceptance_rate``): the engine contract is the counters.
        rate = acceptance_rate(m.total_accepted_tokens, m.total_draft_tokens)
        yield _gauge("spec_decode_acceptance_rate", "Accepted / proposed draft tokens since start", rate, model)
        yield _accepted_histogram(list(m.accepted_histogram), model)
        # Which proposer 'auto' chose and what each kept, and where a step's time went: what
        # shows whether speculation pays on a server's own traffic (and which proposer did).
        yield _by_source("spec_decode_draft_tokens_by_source", "Draft tokens proposed, by proposer",
                         m.draft_tokens_by_source, model)
        yield _by_source("spec_decode_accepted_tokens_by_source", "Draft tokens accepted, by proposer",
                         m.accepted_tokens_by_source, model)
        yield _counter("spec_decode_tree_passes", "Verify passes whose drafts were a token tree (suffix method)",
                       m.tree_passes, model)
        yield _counter("spec_decode_tree_branch_tokens",
                       "Accepted draft tokens from off a token tree's first chain (a linear proposal lacked them)",
                       m.tree_branch_tokens, model)
        yield _counter("spec_decode_draft_seconds", "Seconds spent in draft-model forwards and draws",
                       m.total_draft_seconds, model)
        yield _counter("target_forward_seconds", "Seconds spent in target forwards (prefill, decode, verification)",
                       m.total_target_seconds, model)


def _gauge(name: str, doc: str, value: float, model: str) -> GaugeMetricFamily:
    g = GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=[MODEL_LABEL])
    g.add_metric([model], float(value))
    return g


def _counter(name: str, doc: str, value: float, model: str) -> CounterMetricFamily:
    c = CounterMetricFamily(f"{PREFIX}_{name}", doc, labels=[MODEL_LABEL])
    c.add_metric([model], float(value))
    return c


def _by_source(name: str, doc: str, values: dict[str, int], model: str) -> CounterMetricFamily:
    c = CounterMetricFamily(f"{PREFIX}_{name}", doc, labels=[MODEL_LABEL, "source"])
    for source, value in sorted(dict(values).items()):  # a copy: the engine thread may add a source
        c.add_metric([model, source], float(value))
    return c


def _accepted_histogram(counts: list[int], model: str) -> HistogramMetricFamily:
    """``counts[j]`` verify steps accepted j draft tokens -> a Prometheus histogram over j."""
    buckets: list[tuple[str, float]] = []
    cumulative = 0
    for j, count in enumerate(counts):
        cumulative += count
        buckets.append((str(j), float(cumulative)))
    buckets.append(("+Inf", float(cumulative)))
    total = float(sum(j * c for j, c in enumerate(counts)))
    h = HistogramMetricFamily(
        f"{PREFIX}_spec_decode_accepted_length",
        "Draft tokens accepted per verify step",
        labels=[MODEL_LABEL],
    )
    h.add_metric([model], buckets, sum_value=total)
    return h


class ServerMetrics:
    """The server's registry (its own, so several apps in one process never collide)."""

    def __init__(self, get_engine: Callable[[], Any], get_model_name: Callable[[], str],
                 get_admitted: Callable[[], int] | None = None) -> None:
        # `*_created` timestamp series only add noise to every scrape (process-wide switch).
        disable_created_metrics()
        self.registry = CollectorRegistry()
        r = self.registry
        self.ttft = Histogram(
            f"{PREFIX}_time_to_first_token_seconds", "Time from request arrival to its first token", buckets=TTFT_BUCKETS, registry=r
        )
        self.itl = Histogram(
            f"{PREFIX}_inter_token_latency_seconds", "Time between consecutive output tokens", buckets=ITL_BUCKETS, registry=r
        )
        self.e2e = Histogram(
            f"{PREFIX}_e2e_request_latency_seconds", "Time from request arrival to its last token", buckets=E2E_BUCKETS, registry=r
        )
        self.finished = Counter(
            f"{PREFIX}_request_finished", "Generation choices finished, by finish reason", ["finish_reason"], registry=r
        )
        self.http_requests = Counter(
            f"{PREFIX}_http_requests", "HTTP requests answered, by route and status", ["route", "status"], registry=r
        )
        self.rejected = Counter(
            f"{PREFIX}_requests_rejected", "Requests refused before reaching the engine, by reason", ["reason"], registry=r
        )
        self.queue_time = Histogram(
            f"{PREFIX}_request_queue_time_seconds", "Time a request waited before the scheduler admitted it",
            [MODEL_LABEL], buckets=QUEUE_BUCKETS, registry=r,
        )
        self.prefill_time = Histogram(
            f"{PREFIX}_request_prefill_time_seconds", "Time from admission to a request's first token (its prefill)",
            [MODEL_LABEL], buckets=PREFILL_BUCKETS, registry=r,
        )
        r.register(EngineCollector(get_engine, get_model_name, get_admitted))
        # process_resident_memory_bytes and friends (Linux): memory growth is visible to scrapers
        # and to clients/tools/soak.py without access to the server's /proc.
        ProcessCollector(registry=r)

    def observe_tokens(self, gap_s: float, num_tokens: int) -> None:
        per_token = gap_s / num_tokens
        for _ in range(num_tokens):
            self.itl.observe(per_token)

    def observe_request(self, model: str, stats: Any) -> None:
        """Queue and prefill time of a finished engine request, from the engine's own timestamps."""
        if stats is None or stats.scheduled_time is None:
            return
        self.queue_time.labels(model).observe(max(0.0, stats.scheduled_time - stats.arrival_time))
        if stats.first_token_time is not None:
            self.prefill_time.labels(model).observe(max(0.0, stats.first_token_time - stats.scheduled_time))

    def render(self) -> bytes:
        return generate_latest(self.registry)
