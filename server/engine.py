"""The engine as the HTTP layer sees it: a small protocol, and the one place that builds the real one.

Typing against a protocol (instead of importing ``AsyncEngine`` everywhere) keeps the server's
view of the engine explicit and lets tests drive the HTTP layer with a stand-in engine for faults
the real one cannot be made to produce on demand.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol, TypeVar

from specdec_core.config import EngineConfig
from specdec_core.outputs import RequestOutput
from specdec_core.sampling_params import SamplingParams

T = TypeVar("T")


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

    @property
    def is_healthy(self) -> bool: ...

    @property
    def dead_reason(self) -> str | None: ...

    @property
    def num_unfinished(self) -> int: ...

    def metrics(self) -> Any: ...

    def shutdown(self) -> None: ...


EngineFactory = Callable[[EngineConfig], EngineLike]


def load_engine(config: EngineConfig) -> EngineLike:
    """Build the real engine (blocking: loads weights, starts the engine thread)."""
    from specdec_core import AsyncEngine

    return AsyncEngine(config, progress=True)


async def run_blocking(fn: Callable[[], T], name: str, on_orphan: Callable[[T], None] | None = None) -> T:
    """Run a blocking call in a *daemon* thread and await its result.

    ``asyncio.to_thread`` would use the default executor, whose non-daemon threads the interpreter
    joins at exit: a SIGTERM during a minutes-long model load would then wait for the load to end.
    A daemon thread lets the process exit. ``on_orphan`` receives a result nobody awaits any more
    (the awaiting task was cancelled, or the loop closed), e.g. to shut down a late engine.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def orphan(ok: bool, value: Any) -> None:
        if ok and on_orphan is not None:
            on_orphan(value)

    def deliver(ok: bool, value: Any) -> None:
        if future.done():
            orphan(ok, value)
            return
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)

    def target() -> None:
        try:
            result = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task as is
            ok, value = False, exc
        else:
            ok, value = True, result
        try:
            loop.call_soon_threadsafe(deliver, ok, value)
        except RuntimeError:  # the loop is gone (process shutting down); nobody is waiting any more
            orphan(ok, value)

    threading.Thread(target=target, name=name, daemon=True).start()
    return await future
