"""Where chat templates run: a small pool of their own, each render under a time and output budget.

A chat template is code that came with a model file (or ``--chat-template``). One that loops
(``{% for i in range(99999) %}{% for j in range(99999) %}...``) never returned: seven such requests
took every thread of the default pool that body validation and tokenization share, and then stalled
unrelated requests. So templates run here, never on that pool, and each render has a budget:

- **time** (``--chat-template-timeout``): a render past it is stopped. A Python thread cannot be
  killed, but the render is Jinja's compiled Python, so the watchdog raises ``TemplateOverBudget``
  inside it (``PyThreadState_SetAsyncExc``); the thread is free again at once. The exception is a
  ``BaseException``, so no ``except Exception`` in Jinja or transformers takes it for a template
  error. (A single C call, such as one huge string repetition, is not interrupted; the output
  budget below and the process's memory bound it.)
- **output** (``--chat-template-max-chars``): the rendered text is counted as Jinja yields it (the
  compiled template's ``concat``), and a render that writes more stops there.

At most ``workers`` renders run and ``queue`` wait; beyond that a 503 with ``Retry-After``. Since
every render ends within its budget, a template that loops holds a worker for that long at most,
and requests that render no template (completions, health, metrics) never wait on one. Over
budget is a 400 naming the template (``chat_template_over_budget``).

The pool belongs to ``server.state.ServerState`` (created with the app, shut down with it).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ctypes
import threading
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import structlog

from server.http.errors import APIError

T = TypeVar("T")
log = structlog.get_logger("specdec.server")

TEMPLATE_WORKERS, TEMPLATE_QUEUE = 4, 64


class TemplateOverBudget(BaseException):
    """Raised inside a render that ran past its time or wrote past its output budget."""


class _Budget:
    """One render's budget, shared by its worker thread and its watchdog timer."""

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars
        self.lock = threading.Lock()
        self.thread_id = threading.get_ident()
        self.running = True
        self.reason: str | None = None

    def expire(self) -> None:
        """The watchdog: interrupt the render if it is still running (once)."""
        with self.lock:
            if self.running and self.reason is None:
                self.reason = "time"
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self.thread_id),
                                                           ctypes.py_object(TemplateOverBudget))

    def stop(self) -> None:
        with self.lock:
            self.running = False


_current = threading.local()  # the budget of the render running on this thread, if any


def _budgeted_concat(chunks: Iterable[str]) -> str:
    """Jinja's ``concat`` for a template's output, counting it against the running render's budget."""
    budget: _Budget | None = getattr(_current, "budget", None)
    if budget is None:
        return "".join(chunks)
    out, size = [], 0
    for chunk in chunks:
        size += len(chunk)
        if size > budget.max_chars:
            budget.reason = "output"
            raise TemplateOverBudget
        out.append(chunk)
    return "".join(out)


def budget_template_output(tokenizer: Any) -> bool:
    """Count the output of ``tokenizer``'s chat template(s) against the render's budget. It hooks
    the template transformers compiled and caches (``_compile_jinja_template``, keyed by the text);
    False where this transformers has no such cache (then only the time budget applies)."""
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template
    except ImportError:
        return False
    templates = getattr(tokenizer, "chat_template", None)
    texts = list(templates.values()) if isinstance(templates, dict) else [templates] if templates else []
    for text in texts:
        _compile_jinja_template(text).environment.concat = _budgeted_concat
    return True


class TemplatePool:
    """A bounded executor for chat-template renders; ``run`` from the event loop only."""

    def __init__(self, seconds: float, max_chars: int, workers: int = TEMPLATE_WORKERS, queue: int = TEMPLATE_QUEUE) -> None:
        self.seconds, self.max_chars = seconds, max_chars
        self.workers, self.queue = workers, queue
        self.pending = 0
        self._executor = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="template")

    async def run(self, template_name: str, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` (a render) on a worker, under the budget; a 400 naming ``template_name``
        over budget, a 503 when too many renders wait."""
        if self.pending >= self.workers + self.queue:
            raise APIError(503, "Too many chat templates are being rendered; retry shortly.",
                           code="template_queue_full", headers={"Retry-After": "1"})
        self.pending += 1
        try:
            reason = await asyncio.get_running_loop().run_in_executor(self._executor, self._render, fn, args)
        finally:
            self.pending -= 1
        if isinstance(reason, _OverBudget):
            what = (f"did not finish within {self.seconds:g} s" if reason.reason == "time"
                    else f"wrote more than {self.max_chars} characters")
            log.warning("chat template over budget", template=template_name, reason=reason.reason)
            raise APIError(400, f"{template_name} {what} for these messages; it was stopped.", param="messages",
                           code="chat_template_over_budget")
        return reason

    def _render(self, fn: Callable[..., T], args: tuple[Any, ...]) -> T | _OverBudget:
        budget = _Budget(self.max_chars)
        timer = threading.Timer(self.seconds, budget.expire)
        timer.daemon = True
        try:  # every path out, a late interrupt included, passes this handler
            _current.budget = budget
            timer.start()
            try:
                return fn(*args)
            finally:
                timer.cancel()
                budget.stop()
                _current.budget = None
        except TemplateOverBudget:
            _current.budget = None
            return _OverBudget(budget.reason or "time")

    def shutdown(self) -> None:
        """Drop queued renders; a running one ends within its budget."""
        self._executor.shutdown(wait=False, cancel_futures=True)


class _OverBudget:
    def __init__(self, reason: str) -> None:
        self.reason = reason
