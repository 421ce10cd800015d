"""What the server knows about itself: lifecycle phase, the engine, admission and in-flight work.

Phases: ``loading`` (HTTP answers, /health 503, generation 503) -> ``ready`` -> ``draining`` after
SIGTERM (no new generation, in-flight ones finish) -> ``stopped``. ``failed`` means the engine
could not be built. A ready server whose engine loop died reports it through /health and 503s.
"""

from __future__ import annotations

import enum
import math
import time
from typing import Protocol

from server.http.errors import APIError
from server.prometheus import ServerMetrics
from server.services.engine_host import EngineLike
from server.services.grammar_pool import GrammarPool
from server.services.response_store import ResponseStore
from server.services.template_pool import TemplatePool
from server.settings import ServerSettings


def engine_dead() -> APIError:
    """The answer to any request once the engine's loop has stopped (the process must restart)."""
    return APIError(503, "The inference engine stopped; the server needs a restart.", code="engine_dead")


class Phase(str, enum.Enum):
    LOADING = "loading"
    READY = "ready"
    DRAINING = "draining"
    FAILED = "failed"
    STOPPED = "stopped"


class Abortable(Protocol):
    def abort(self) -> None: ...


class ServerState:
    """Shared by the app's routes and the process runner (which drives draining)."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self.phase = Phase.LOADING
        self.engine: EngineLike | None = None
        self.load_error: str | None = None
        # ``created`` of the model card: when this server started serving it.
        self.created = int(time.time())
        self.metrics = ServerMetrics(lambda: self.engine, lambda: self.served_model_name, lambda: self.admitted)
        # Open generations and how many engine requests (sequences) each holds.
        self.in_flight: dict[Abortable, int] = {}
        self.admitted = 0
        # Mean end-to-end latency of recent requests (EWMA), for Retry-After estimates.
        self._mean_latency_s = 1.0
        # Structured-output compiles: their own bounded pool, shut down with the app (``close``).
        self.grammar_pool = GrammarPool()
        # Chat-template renders: their own bounded pool, each under a time and output budget.
        self.template_pool = TemplatePool(settings.chat_template_timeout, settings.chat_template_max_chars)
        # /v1/responses with "store": true (``server.services.response_store``), per process.
        self.responses = ResponseStore(settings.responses_store_entries, settings.responses_store_bytes,
                                       settings.responses_store_ttl)

    # -- lifecycle ---------------------------------------------------------------------------
    @property
    def served_model_name(self) -> str:
        if self.settings.served_model_name:
            return self.settings.served_model_name
        return self.engine.model_name if self.engine is not None else "unknown"

    def health(self) -> tuple[bool, dict]:
        """(ok, body) for /health."""
        if self.phase is Phase.READY and self.engine is not None:
            if self.engine.is_healthy:
                return True, {"status": "ok"}
            return False, {"status": "dead", "reason": self.engine.dead_reason or "engine loop stopped"}
        body: dict = {"status": self.phase.value}
        if self.phase is Phase.FAILED and self.load_error:
            body["reason"] = self.load_error
        return False, body

    def require_engine(self) -> EngineLike:
        """The engine, if new generation may start now; else a 503 that says why."""
        if self.phase is Phase.LOADING:
            raise APIError(503, "The model is still loading; retry shortly.", code="model_loading", headers={"Retry-After": "5"})
        if self.phase in (Phase.DRAINING, Phase.STOPPED):
            raise APIError(503, "The server is shutting down and accepts no new requests.", code="shutting_down")
        if self.phase is Phase.FAILED or self.engine is None:
            raise APIError(503, "The model failed to load.", code="engine_unavailable")
        if not self.engine.is_healthy:
            raise engine_dead()
        return self.engine

    # -- admission -----------------------------------------------------------------------------
    def admit(self, engine: EngineLike, num_requests: int) -> None:
        """Refuse with 429 when ``num_requests`` more would overflow the queue (``--max-queue``).

        Must be called right before submitting, with no ``await`` in between, so concurrent HTTP
        requests cannot both pass the check on the same free slot; ``started`` then counts them.
        """
        max_queue = self.settings.max_queue
        if max_queue is None:
            return
        running_slots = self.settings.engine.max_num_seqs
        capacity = running_slots + max_queue
        if num_requests > capacity:
            raise APIError(
                400,
                f"This request needs {num_requests} sequences but the server holds at most {capacity} "
                "(running + queued); lower 'n' or send fewer prompts.",
                param="n",
            )
        # The server's own count, released the moment a generation closes (its client left): the
        # engine's count lagged a step behind every abort, and 300 clients that left at once kept
        # new requests out with 429s for seconds while /metrics showed an idle engine.
        unfinished = self.admitted
        if unfinished + num_requests > capacity:
            excess = unfinished + num_requests - capacity
            retry_after = max(1, math.ceil(self._mean_latency_s * math.ceil(excess / running_slots)))
            self.metrics.rejected.labels(reason="queue_full").inc()
            raise APIError(
                429,
                f"The server is at capacity ({unfinished} requests in flight, queue limit {max_queue}); "
                f"retry after {retry_after} s.",
                code="queue_full",
                headers={"Retry-After": str(retry_after)},
            )

    def record_latency(self, seconds: float) -> None:
        self._mean_latency_s = 0.8 * self._mean_latency_s + 0.2 * seconds

    # -- in-flight work --------------------------------------------------------------------------
    def started(self, item: Abortable, num_requests: int) -> None:
        """``item`` submitted ``num_requests`` engine requests (right after ``admit``)."""
        self.in_flight[item] = num_requests
        self.admitted += num_requests

    def ended(self, item: Abortable) -> None:
        """``item`` closed (finished, failed or its client left): its admission is released."""
        self.admitted -= self.in_flight.pop(item, 0)

    def close(self) -> None:
        """Release what the state owns (the app's lifespan calls this once it has stopped)."""
        self.grammar_pool.shutdown()
        self.template_pool.shutdown()

    def abort_all(self) -> int:
        """Abort every in-flight generation (shutdown past its grace period). Returns how many."""
        items = list(self.in_flight)
        for item in items:
            item.abort()
        return len(items)
