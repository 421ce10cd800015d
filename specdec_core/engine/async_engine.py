"""Asyncio facade: the step loop runs on its own thread; callers ``async for`` over deltas.

Requests and aborts reach the engine thread through an inbox; deltas come back to each caller's
event loop with ``call_soon_threadsafe``. Cancelling a consumer aborts its request, whose cache
region is freed at the next step. An aborted stream still ends with the engine's own final output
(``finish_reason="abort"``), so a consumer always sees a finished last item. If the loop itself
dies, every caller gets an error and ``is_healthy`` turns false instead of anyone hanging.
``shutdown()`` stops the loop at a step boundary and waits for it: the process must never exit
while the engine thread is inside a torch call (torch then aborts the process with
"terminate called without an active exception").
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from typing import AsyncIterator

from specdec_core.decoding.sampling_params import SamplingParams
from specdec_core.decoding.structured_output import StructuredOutput
from specdec_core.engine.config import EngineConfig
from specdec_core.engine.engine import Engine
from specdec_core.engine.outputs import FinishReason, RequestOutput
from specdec_core.engine.request import Request
from specdec_core.engine.stats import EngineMetrics
from specdec_core.loading.progress_log import phase

log = logging.getLogger("specdec.async_engine")


class EngineDeadError(RuntimeError):
    """The engine loop has stopped; no request can be served."""


class RequestStream:
    """Deltas of one request, in order; the last one has ``finished=True``."""

    def __init__(self, engine: "AsyncEngine", req: Request, loop: asyncio.AbstractEventLoop) -> None:
        self._engine = engine
        self.request_id = req.request_id
        self.prompt_token_ids = req.prompt_ids
        self._loop = loop
        self._queue: asyncio.Queue[RequestOutput] = asyncio.Queue()
        # Set when the final output has been handed to the consumer, never earlier: a stream that
        # stopped at abort() time would drop the engine's final output and leave readers waiting.
        self.finished = False
        self._abort_requested = False

    def _deliver(self, out: RequestOutput) -> None:
        self._queue.put_nowait(out)

    def __aiter__(self) -> "RequestStream":
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        try:
            out = await self._queue.get()
        except asyncio.CancelledError:
            self.abort()
            raise
        if out.finished:
            self.finished = True
        return out

    def abort(self) -> None:
        """Ask the engine to stop this request (idempotent). The stream goes on until the engine's
        final output: ``finish_reason="abort"``, or the request's own if it finished first."""
        if not self.finished and not self._abort_requested:
            self._abort_requested = True
            self._engine.abort(self.request_id)


class AsyncEngine:
    """Thread-backed engine. Construction loads the models (blocking: use ``asyncio.to_thread``)."""

    def __init__(self, config: EngineConfig, progress: bool = True, engine: Engine | None = None) -> None:
        self._lock = threading.Lock()
        self._wakeup = threading.Condition(self._lock)
        self._inbox: deque[tuple[str, object]] = deque()
        self._streams: dict[str, RequestStream] = {}
        self._stopping = False
        # Set (under the lock) once the loop has failed every stream on its way out: no stream may
        # be registered after that, or nobody would ever finish it.
        self._closed = False
        self.dead_reason: str | None = None
        # The models are built on the engine thread itself: torch's OpenMP workers spin (about
        # 25x slower steps, measured) once the thread that first ran parallel work has exited,
        # so that thread must be the long-lived one.
        built = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            try:
                if engine is not None:
                    self.engine = engine
                else:
                    # The phases inside log themselves; this one keeps the gaps between them (kernel
                    # preparation, calibration) from going silent.
                    with phase(log, "starting the engine (loading the models, preparing their kernels, calibrating)"):
                        self.engine = Engine(config, progress=progress, work_when_idle=True)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the constructor's thread
                failure.append(exc)
                return
            finally:
                built.set()
            self._loop()

        self._thread = threading.Thread(target=run, name="specdec-engine", daemon=True)
        self._thread.start()
        built.wait()
        if failure:
            raise failure[0]
        self.tokenizer = self.engine.tokenizer
        self.model_name = self.engine.model_name
        self.speculative_method = self.engine.method
        self.num_speculative_tokens = self.engine.num_speculative_tokens
        self.max_model_len = self.engine.max_model_len
        self.vocab_size = self.engine.vocab_size

    # -------------------------------------------------------------- caller side (event loop)

    @property
    def is_healthy(self) -> bool:
        return self.dead_reason is None and self._thread.is_alive()

    @property
    def num_unfinished(self) -> int:
        return len(self._streams)

    def compile_structured(self, spec: StructuredOutput) -> None:
        """Check (and cache) a structured-output spec: ``ValueError`` says why it cannot be
        compiled. Thread-safe and not instant: call it off the event loop."""
        self.engine.compile_structured(spec)

    def add_request(self, prompt: str | list[int], params: SamplingParams,
                    request_id: str | None = None) -> RequestStream:
        """Validate (``ValueError`` with a clear message) and queue a request."""
        if not self.is_healthy:
            raise EngineDeadError(f"engine loop is not running: {self.dead_reason or 'stopped'}")
        req = self.engine.make_request(prompt, params, request_id)
        stream = RequestStream(self, req, asyncio.get_running_loop())
        with self._lock:
            if self._closed or self._stopping:
                raise EngineDeadError(f"engine loop is not running: {self.dead_reason or 'shut down'}")
            if req.request_id in self._streams:
                raise ValueError(f"request id {req.request_id!r} is already in use")
            self._streams[req.request_id] = stream
            self._inbox.append(("add", req))
            self._wakeup.notify()
        return stream

    async def generate(self, prompt: str | list[int], params: SamplingParams,
                       request_id: str | None = None) -> AsyncIterator[RequestOutput]:
        stream = self.add_request(prompt, params, request_id)
        try:
            async for out in stream:
                yield out
        finally:
            stream.abort()

    def abort(self, request_id: str) -> None:
        with self._lock:
            self._inbox.append(("abort", request_id))
            self._wakeup.notify()

    def metrics(self) -> EngineMetrics:
        return self.engine.metrics

    def shutdown(self, timeout: float | None = None) -> bool:
        """Stop the loop at its next step boundary and wait for the thread to end; requests still
        running end with ``finish_reason="abort"``. ``timeout=None`` waits as long as the step in
        flight takes (a long prefill can take seconds): leaving the thread inside a step would let
        the process exit under it. Returns whether the thread has ended."""
        with self._lock:
            self._stopping = True
            self._wakeup.notify()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    # -------------------------------------------------------------- engine thread

    def _loop(self) -> None:
        try:
            while True:
                with self._lock:
                    idle = not self._inbox and not self.engine.has_unfinished()
                    while idle and not self._stopping and not self.engine.deferred.owed:
                        self._wakeup.wait()
                        idle = not self._inbox and not self.engine.has_unfinished()
                    if self._stopping:
                        break
                    inbox, self._inbox = self._inbox, deque()
                if idle:  # nothing to serve: start-up work still owed (a calibration's forward), outside the lock
                    self.engine.deferred.run_one()
                    continue
                outputs: list[RequestOutput] = []
                for kind, payload in inbox:
                    if kind == "add":
                        self.engine.add_request(payload)  # type: ignore[arg-type]
                    else:
                        out = self.engine.abort(payload)  # type: ignore[arg-type]
                        if out is not None:
                            outputs.append(out)
                outputs += self.engine.step()
                self._dispatch(outputs)
            self.engine.step_costs.save()  # stopped: the next start begins from what this run learned
        except BaseException as exc:  # noqa: BLE001 - make a dead loop visible, never hang callers
            log.exception("engine loop died")
            self.dead_reason = f"{type(exc).__name__}: {exc}"
        finally:
            self._fail_all()

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[RequestStream, RequestOutput]]] = {}
        with self._lock:
            for out in outputs:
                stream = self._streams.get(out.request_id)
                if stream is None:
                    continue
                if out.finished:
                    del self._streams[out.request_id]
                by_loop.setdefault(stream._loop, []).append((stream, out))
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_deliver_all, items)
            except RuntimeError:  # the caller's loop is closed; nobody is listening
                pass

    def _fail_all(self) -> None:
        """End every stream still open: an error if the loop died, an abort if it was shut down."""
        with self._lock:
            self._closed = True
            streams, self._streams = list(self._streams.values()), {}
        reason: FinishReason = "error" if self.dead_reason else "abort"
        error = self.dead_reason
        for stream in streams:
            out = RequestOutput(stream.request_id, [], "", finished=True, finish_reason=reason, error=error)
            try:
                stream._loop.call_soon_threadsafe(stream._deliver, out)
            except RuntimeError:
                pass


def _deliver_all(items: list[tuple[RequestStream, RequestOutput]]) -> None:
    for stream, out in items:
        stream._deliver(out)
