"""Where structured-output grammars are compiled: one small pool per server, with its own queue bound.

Compiles never run on the event loop (a 1 MB schema with ``n: 128`` once stalled ``/health`` 5.5 s)
nor on the default thread pool that validation and tokenization share (a trivial request once
waited 62 s behind eight 8 MB schemas). At most ``queue`` compiles wait behind the ``workers``
running ones; beyond that a 503 with ``Retry-After``, not an ever longer queue.

The workers get a large stack: llguidance compiles a schema by recursing through its ``$ref``
chains in native code, and a 100 KB schema of 1,000 ``$defs`` that refer to each other in a ring
overflowed the 8 MB default stack and killed the whole process with SIGSEGV (32 MB was enough
for the 120,000-character cap; 256 MB is address space, touched only as deep as a compile goes).

The pool belongs to ``server.state.ServerState`` (created with the app, shut down with it).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable
from typing import TypeVar

from server.http.errors import APIError

T = TypeVar("T")

GRAMMAR_WORKERS, GRAMMAR_QUEUE = 1, 4
GRAMMAR_STACK_BYTES = 256 * 1024 * 1024
_stack_size_lock = threading.Lock()


class GrammarPool:
    """A bounded executor for grammar compiles; ``run`` from the event loop only (``pending`` is
    counted there, without a lock)."""

    def __init__(self, workers: int = GRAMMAR_WORKERS, queue: int = GRAMMAR_QUEUE,
                 stack_bytes: int = GRAMMAR_STACK_BYTES) -> None:
        self.workers, self.queue = workers, queue
        self.pending = 0
        self._executor = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="grammar")
        # threading.stack_size is process-wide and applies to threads started after it: start the
        # workers now, under the large size, and put the default back.
        with _stack_size_lock:
            previous = threading.stack_size(stack_bytes)
            try:
                ready = [self._executor.submit(_started) for _ in range(workers)]
                concurrent.futures.wait(ready)
            finally:
                threading.stack_size(previous)

    @property
    def full(self) -> bool:
        return self.pending >= self.workers + self.queue

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)`` on a worker; the 503 ``grammar_queue_full`` when the queue is full."""
        if self.full:
            raise APIError(503, "Too many structured-output grammars are being compiled; retry shortly.",
                           code="grammar_queue_full", headers={"Retry-After": "1"})
        self.pending += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)
        finally:
            self.pending -= 1

    def shutdown(self) -> None:
        """Drop queued compiles; a running one finishes on its own (its thread is not waited for)."""
        self._executor.shutdown(wait=False, cancel_futures=True)


def _started() -> None:
    """A no-op whose only purpose is to make the executor start a worker thread now."""
