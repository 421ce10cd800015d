"""The engine requests behind one HTTP request: submit together, merge their deltas, end together.

An OpenAI request with ``n`` choices (times several prompts, for completions) becomes one engine
request per choice. ``Generation`` submits them under one admission check, merges their delta
streams into one sequence (so a stream can interleave choices), measures the latency metrics from
delta arrival times, and guarantees that however the HTTP side ends (done, error, client gone,
shutdown) every engine request still running is aborted so its cache is freed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from typing import Any

import structlog

from server.api import response_types as rt
from server.api.speculative import speculative_summary
from server.http.errors import APIError, internal_error, invalid_request
from server.services.engine_host import EngineLike, RequestStreamLike
from server.state import ServerState, engine_dead
from specdec_core.decoding.sampling_params import SamplingParams
from specdec_core.decoding.token_logprob import TokenLogprob
from specdec_core.engine.outputs import RequestOutput, RequestStats

log = structlog.get_logger("specdec.server")


def ends_the_request(finish_reason: str | None) -> bool:
    """A choice that failed or was aborted ends the whole request (stream or body): the client gets
    an error, never a partial answer that looks complete."""
    return finish_reason in ("error", "abort")


@dataclass
class Job:
    """One engine request: the OpenAI choice ``index`` it produces."""

    index: int
    prompt_ids: list[int]
    params: SamplingParams
    # Usage counts a prompt once even when n choices share it.
    counts_prompt: bool = True
    # Fed each delta's text; True once the answer is complete although the model goes on (a
    # repeated tool call, ``server.tools``): a stop condition the server applies, like a stop string.
    end_check: Callable[[str], bool] | None = None


@dataclass
class Choice:
    """What one choice has produced so far."""

    index: int
    prompt_tokens: int
    counts_prompt: bool
    prompt_ids: list[int] = field(default_factory=list)
    # When asked for: per prompt token (the first None), from the engine's first delta.
    prompt_logprobs: list[TokenLogprob | None] | None = None
    text: list[str] = field(default_factory=list)
    # The generated token ids (the Messages API decodes them to name the stop sequence that ended it).
    token_ids: list[int] = field(default_factory=list)
    num_tokens: int = 0
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finished: bool = False
    finish_reason: str | None = None
    ending: bool = False  # its end_check fired: the engine was told to stop, later text is dropped
    error: str | None = None
    stats: RequestStats | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None

    @property
    def completion_tokens(self) -> int:
        return self.stats.completion_tokens if self.stats is not None else self.num_tokens


class Generation:
    """Submit, observe and end the engine requests of one HTTP request (see module docstring)."""

    def __init__(
        self,
        state: ServerState,
        engine: EngineLike,
        request_id: str,
        jobs: list[Job],
        *,
        arrival: float,
        log_fields: dict[str, Any],
    ) -> None:
        self.state = state
        self.engine = engine
        self.request_id = request_id
        self.jobs = jobs
        self.arrival = arrival
        self.log_fields = log_fields
        self.choices = {job.index: Choice(job.index, len(job.prompt_ids), job.counts_prompt, job.prompt_ids) for job in jobs}
        self._end_checks = {job.index: job.end_check for job in jobs if job.end_check is not None}
        self.streams: dict[int, RequestStreamLike] = {}
        self._pumps: list[asyncio.Task[None]] = []
        self._queue: asyncio.Queue[tuple[int, RequestOutput | BaseException]] = asyncio.Queue()
        self._closed = False
        self.disconnected = False
        speculative_off = all(job.params.num_speculative_tokens == 0 for job in jobs)
        self.method = "none" if speculative_off else engine.speculative_method

    # -- submission --------------------------------------------------------------------------
    def start(self) -> None:
        """Admit (429 when the queue is full) and submit every choice; all or nothing. The phase is
        checked again: the route awaited tokenization since it first looked (a drain may have begun)."""
        self.state.require_engine()
        self.state.admit(self.engine, len(self.jobs))
        try:
            for job in self.jobs:
                self.streams[job.index] = self.engine.add_request(
                    job.prompt_ids, job.params, request_id=f"{self.request_id}-{job.index}"
                )
        except ValueError as exc:  # the engine's own input checks (the server checks first)
            self._abort_streams()
            raise invalid_request(str(exc), "prompt") from None
        except Exception:
            self._abort_streams()
            if not self.engine.is_healthy:
                raise engine_dead() from None
            log.exception("add_request failed", request_id=self.request_id)
            raise internal_error(self.request_id) from None
        self.state.started(self, len(self.jobs))
        for index, stream in self.streams.items():
            self._pumps.append(asyncio.create_task(self._pump(index, stream), name=f"pump-{self.request_id}-{index}"))

    async def _pump(self, index: int, stream: RequestStreamLike) -> None:
        try:
            async for out in stream:
                self._queue.put_nowait((index, out))
        except Exception as exc:  # a failure while streaming one request ends that request only
            self._queue.put_nowait((index, exc))

    # -- observation ---------------------------------------------------------------------------
    @property
    def all_finished(self) -> bool:
        return all(c.finished for c in self.choices.values())

    async def deltas(self) -> AsyncIterator[tuple[Choice, RequestOutput]]:
        """Deltas of all choices in arrival order; stops early when a choice fails or is aborted."""
        while not self.all_finished:
            index, item = await self._queue.get()
            choice = self.choices[index]
            if choice.finished:  # e.g. the engine's own end arriving after abort() ended it here
                continue
            if isinstance(item, BaseException):
                log.error("engine stream failed", request_id=self.request_id, choice=index, error=repr(item))
                item = RequestOutput(
                    request_id=f"{self.request_id}-{index}", token_ids=[], text="", finished=True,
                    finish_reason="error", error=repr(item),
                )
            elif choice.ending:  # only the engine's final output (its stats) still counts
                if not item.finished:
                    continue
                item = replace(item, token_ids=[], text="", logprobs=None, sources=[], provenance=None,
                               finish_reason="error" if item.finish_reason == "error" else "stop")
            else:
                self._check_end(choice, item)
            self._record(choice, item)
            yield choice, item
            if choice.finished and ends_the_request(choice.finish_reason):
                return

    def _check_end(self, choice: Choice, out: RequestOutput) -> None:
        """Apply the job's ``end_check``: once it fires, the engine is told to stop the request and
        the choice ends with "stop" when the engine's final output arrives (tokens generated in
        between are not sent). The tokens before it are exactly the model's: nothing is resampled."""
        check = self._end_checks.get(choice.index)
        if check is None or not out.text or out.finished or not check(out.text):
            return
        choice.ending = True
        self.streams[choice.index].abort()

    def _record(self, choice: Choice, out: RequestOutput) -> None:
        now = time.perf_counter()
        metrics = self.state.metrics
        if out.token_ids:
            if choice.first_token_at is None:
                choice.first_token_at = now
                metrics.ttft.observe(now - self.arrival)
            else:
                metrics.observe_tokens(now - (choice.last_token_at or now), len(out.token_ids))
            choice.last_token_at = now
            choice.num_tokens += len(out.token_ids)
            choice.token_ids.extend(out.token_ids)
        if out.text:
            choice.text.append(out.text)
        if out.logprobs:
            choice.logprobs.extend(out.logprobs)
        if out.prompt_logprobs is not None:
            choice.prompt_logprobs = out.prompt_logprobs
        if out.finished:
            choice.finished = True
            choice.finish_reason = out.finish_reason or "stop"
            choice.error = out.error
            choice.stats = out.stats
            metrics.finished.labels(finish_reason=choice.finish_reason).inc()
            metrics.e2e.observe(now - self.arrival)
            metrics.observe_request(self.state.served_model_name, out.stats)
            if choice.finish_reason == "error":
                log.error("request failed in the engine", request_id=self.request_id, choice=choice.index, error=out.error)

    async def run(self) -> None:
        """Consume every delta (non-streamed responses)."""
        async for _ in self.deltas():
            pass

    # -- results ---------------------------------------------------------------------------------
    def failure(self) -> APIError | None:
        """Why the request as a whole failed, if it did (an error or abort in any choice)."""
        for choice in self.choices.values():
            if choice.finish_reason == "error":
                return internal_error(self.request_id)
        for choice in self.choices.values():
            if choice.finish_reason == "abort":
                return APIError(503, "The request was aborted because the server is shutting down.", code="aborted")
        return None

    @property
    def prompt_tokens(self) -> int:
        return sum(c.prompt_tokens for c in self.choices.values() if c.counts_prompt)

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens the prefix cache served (counted once per prompt, like ``prompt_tokens``)."""
        return sum(c.stats.cached_tokens for c in self.choices.values() if c.counts_prompt and c.stats is not None)

    @property
    def stored_tokens(self) -> int:
        """Prompt tokens this request wrote into the prefix cache (counted once per prompt)."""
        return sum(c.stats.stored_tokens for c in self.choices.values() if c.counts_prompt and c.stats is not None)

    @property
    def completion_tokens(self) -> int:
        return sum(c.completion_tokens for c in self.choices.values())

    def speculative(self) -> rt.Speculative:
        return speculative_summary(self.method, (c.stats for c in self.choices.values()))

    # -- ending ----------------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    def abort(self) -> None:
        """End every unfinished choice now with finish_reason 'abort' (shutdown past its grace
        period) and tell the engine to stop them.

        The end is local on purpose: the engine answers an abort only at its next step boundary,
        and a step can be long (a long prefill); the client's response must not wait for it. The
        engine frees the requests' caches when its step ends."""
        for index, choice in self.choices.items():
            if not choice.finished:
                self._queue.put_nowait((index, RequestOutput(
                    request_id=f"{self.request_id}-{index}", token_ids=[], text="", finished=True,
                    finish_reason="abort",
                )))
        self._abort_streams()

    def _abort_streams(self) -> None:
        for index, stream in self.streams.items():
            if not self.choices[index].finished:
                stream.abort()

    def close(self) -> None:
        """End this generation however the HTTP side ended; idempotent. Fills the request log."""
        if self._closed:
            return
        self._closed = True
        self._abort_streams()
        for choice in self.choices.values():
            if not choice.finished:  # aborted here; its final delta will not be observed any more
                self.state.metrics.finished.labels(finish_reason="abort").inc()
        for task in self._pumps:
            task.cancel()
        self.state.ended(self)
        elapsed = time.perf_counter() - self.arrival
        self.state.record_latency(elapsed)
        firsts = [c.first_token_at for c in self.choices.values() if c.first_token_at is not None]
        spec = self.speculative()
        if self.disconnected:
            outcome = "client_disconnected"
        elif not self.all_finished:
            outcome = "incomplete"
        else:
            failure = self.failure()
            outcome = "ok" if failure is None else (failure.code or "error")
        self.log_fields.update(
            outcome=outcome,
            n=len(self.jobs),
            prompt_tokens=self.prompt_tokens,
            cached_tokens=self.cached_tokens,
            completion_tokens=self.completion_tokens,
            finish_reasons=[c.finish_reason for c in self.choices.values()],
            speculative_method=self.method,
            draft_tokens=spec["draft_tokens"],
            accepted_tokens=spec["accepted_tokens"],
            acceptance_rate=round(spec["acceptance_rate"], 4),
            mean_accepted_length=round(spec["mean_accepted_length"], 4),
            ttft_s=round(min(firsts) - self.arrival, 4) if firsts else None,
        )


async def run_until_disconnect(generation: Generation, receive: Any) -> bool:
    """Run a non-streamed generation to its end, aborting it if the client goes away.

    Returns False if the client disconnected first. ``receive`` is the ASGI receive callable;
    once the body is read, its next message is ``http.disconnect``.
    """

    async def wait_disconnect() -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return

    runner = asyncio.ensure_future(generation.run())
    watcher = asyncio.ensure_future(wait_disconnect())
    try:
        done, _ = await asyncio.wait({runner, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # we were cancelled ourselves (server shutdown): take both down
        runner.cancel()
        raise
    finally:
        watcher.cancel()
    if runner in done:
        runner.result()
        return True
    runner.cancel()
    await asyncio.gather(runner, return_exceptions=True)
    generation.disconnected = True
    return False
