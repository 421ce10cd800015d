"""The engine as the HTTP layer sees it: a small protocol, and the one place that builds the real one.

Typing against a protocol (instead of importing ``AsyncEngine`` everywhere) keeps the server's
view of the engine explicit and lets tests drive the HTTP layer with a stand-in engine for faults
the real one cannot be made to produce on demand.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import structlog

from specdec_core.decoding.sampling_params import SamplingParams
from specdec_core.decoding.structured_output import StructuredOutput
from specdec_core.engine.config import EngineConfig
from specdec_core.engine.outputs import RequestOutput

log = structlog.get_logger("specdec.server")

# How often a shutdown that waits for a long engine step says so.
ENGINE_WAIT_LOG_S = 10.0


class RequestStreamLike(Protocol):
    request_id: str
    prompt_token_ids: list[int]

    def __aiter__(self) -> AsyncIterator[RequestOutput]: ...

    def abort(self) -> None: ...


class EngineLike(Protocol):
    tokenizer: Any
    model_name: str
    speculative_method: str
    num_speculative_tokens: int
    max_model_len: int
    vocab_size: int

    def add_request(
        self, prompt: str | list[int], params: SamplingParams, request_id: str | None = None
    ) -> RequestStreamLike: ...

    def abort(self, request_id: str) -> None: ...

    def compile_structured(self, spec: StructuredOutput) -> object: ...

    @property
    def is_healthy(self) -> bool: ...

    @property
    def dead_reason(self) -> str | None: ...

    @property
    def num_unfinished(self) -> int: ...

    def metrics(self) -> Any: ...

    def shutdown(self) -> object: ...


EngineFactory = Callable[[EngineConfig], EngineLike]


def load_engine(config: EngineConfig) -> EngineLike:
    """Build the real engine (blocking: loads weights, starts the engine thread), then mark the
    heap it left as permanent for the garbage collector (vLLM's engine core does the same).

    The models, tokenizer and libraries leave ~490K objects the cyclic collector would otherwise
    walk in every full collection: ~320 ms each on the default pair, with the GIL held, so the
    engine thread stalls too, whichever thread allocated. Frozen objects are never freed by the
    collector, which is what a server's one engine wants (it lives as long as the process); the
    garbage of loading is collected first. Only this builder freezes: tests that build engines
    in-process, one after another, must not keep them.
    """
    from specdec_core import AsyncEngine

    engine = AsyncEngine(config, progress=True)
    gc.collect()
    gc.freeze()
    return engine


class EngineHost:
    """The thread that builds the engine off the event loop and later shuts it down.

    Building happens off the event loop so HTTP answers (503) while weights load. (The engine keeps
    torch's OpenMP workers on its own long-lived thread; see ``specdec_core.engine.async_engine``.)
    It is a daemon thread: a SIGTERM during a minutes-long load must not wait for the load.
    """

    def __init__(self, factory: Callable[[EngineConfig], EngineLike], config: EngineConfig) -> None:
        self._factory = factory
        self._config = config
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._built = threading.Event()
        self._thread: threading.Thread | None = None

    async def start(self) -> EngineLike:
        """Build the engine on the host thread; raises what the factory raised."""
        loop = asyncio.get_running_loop()
        built: asyncio.Future[EngineLike] = loop.create_future()

        def deliver(ok: bool, value: Any) -> None:
            if built.done():
                return
            if ok:
                built.set_result(value)
            else:
                built.set_exception(value)

        def host() -> None:
            engine: EngineLike | None = None
            value: EngineLike | BaseException
            try:
                try:
                    engine = self._factory(self._config)
                    ok, value = True, engine
                except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
                    ok, value = False, exc
                with contextlib.suppress(RuntimeError):  # loop closed: nobody is waiting any more
                    loop.call_soon_threadsafe(deliver, ok, value)
                if engine is not None:
                    self._built.set()
                    self._stop.wait()
                    engine.shutdown()
            finally:
                self._stopped.set()

        self._thread = threading.Thread(target=host, name="specdec-engine-host", daemon=True)
        self._thread.start()
        return await built

    @property
    def busy(self) -> bool:
        """True while the host thread may still be inside torch: loading the engine, or running it
        when it was never stopped (a forced exit). Past ``_stopped`` it only returns."""
        return self._thread is not None and not self._stopped.is_set()

    async def stop(self) -> None:
        """Shut the engine down on its host thread and wait for it, however long the step in flight
        takes (a long prefill): exiting under a running step aborts the process. The wait is
        logged every ``ENGINE_WAIT_LOG_S`` so a slow stop is visible, not silent.

        While the engine is still loading there is nothing to stop: the runner exits without
        waiting for the load (see ``server.runner``)."""
        self._stop.set()
        if self._thread is None or not self._built.is_set():
            return
        log.info("stopping the engine at its next step boundary")
        started = time.monotonic()
        while not await asyncio.to_thread(self._stopped.wait, ENGINE_WAIT_LOG_S):
            log.info("waiting for the engine to finish its current step", waited_s=round(time.monotonic() - started, 1))
        log.info("engine stopped", waited_s=round(time.monotonic() - started, 1))
