"""Test-only faults: every engine request whose prompt text mentions a marker fails while being
committed, after its batch's forward and verification (``fail_requests_mentioning``), or fails
every batch it is part of before the commit: before the step runs (``fail_batches_holding``) or
once the step is planned, every request's random draws taken (``fail_planned_steps_holding``).
The engine itself has no such hook; tests
patch it in (in-process with pytest's monkeypatch, or in a server through ``held_step_server.py``'s
``FAULT_MARKER``), to prove that one request's failure leaves the others running."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import specdec_core.engine.engine as engine_module
from specdec_core.engine.speculative_step import SpeculativeStep


def _mark_requests_mentioning(marker: str, setattr_: Callable[[Any, str, Any], None]) -> set[str]:
    """Patch ``Engine.make_request`` to remember the ids of requests whose prompt mentions ``marker``."""
    Engine = engine_module.Engine
    real_make = Engine.make_request
    faulty: set[str] = set()

    def make_request(self: Any, prompt: Any, params: Any, request_id: str | None = None) -> Any:
        req = real_make(self, prompt, params, request_id)
        if marker in self.tokenizer.decode(req.prompt_ids):
            faulty.add(req.request_id)
        return req

    setattr_(Engine, "make_request", make_request)
    return faulty


def fail_batches_holding(marker: str, setattr_: Callable[[Any, str, Any], None] = setattr) -> list[int]:
    """Patch ``Engine._run`` so any batch holding a request whose prompt mentions ``marker`` raises
    before anything is committed (as an out-of-range id in the sampler did). Returns the sizes of
    every batch ``_run`` was asked to run, in order, so a test can count the isolation's work."""
    faulty = _mark_requests_mentioning(marker, setattr_)
    real_run = engine_module.Engine._run
    sizes: list[int] = []

    def run(self: Any, plan: Any, **kwargs: Any) -> Any:
        sizes.append(len(plan.items))
        if any(it.request.request_id in faulty for it in plan.items):
            raise RuntimeError(f"fault injected for testing (prompt mentions {marker!r})")
        return real_run(self, plan, **kwargs)

    setattr_(engine_module.Engine, "_run", run)
    return sizes


def fail_requests_mentioning(marker: str, setattr_: Callable[[Any, str, Any], None] = setattr) -> None:
    """Patch ``Engine`` so requests whose prompt decodes to text containing ``marker`` fail at
    commit; ``setattr_`` is ``monkeypatch.setattr`` where the patch must be undone after a test."""
    faulty = _mark_requests_mentioning(marker, setattr_)
    Engine = engine_module.Engine
    real_commit = Engine._commit

    def commit(self: Any, item: Any, *args: Any, **kwargs: Any) -> Any:
        if item.request.request_id in faulty:
            faulty.discard(item.request.request_id)
            raise RuntimeError(f"fault injected for testing (prompt mentions {marker!r})")
        return real_commit(self, item, *args, **kwargs)

    setattr_(Engine, "_commit", commit)


def fail_planned_steps_holding(marker: str, setattr_: Callable[[Any, str, Any], None] = setattr,
                               after_tokens: int = 0) -> None:
    """Patch ``SpeculativeStep._plan`` so a step holding a request whose prompt mentions ``marker``
    (once it has ``after_tokens`` output tokens: a decode step, where the others draft) raises
    once its plan is made (every request's uniforms drawn, as for a fault in the forward or the
    sampler): the engine bisects the batch and runs its other requests again."""
    faulty = _mark_requests_mentioning(marker, setattr_)
    real_plan = SpeculativeStep._plan

    def plan(self: Any, items: Any, upload: Any) -> Any:
        planned = real_plan(self, items, upload)
        if any(it.request.request_id in faulty and len(it.request.output_ids) >= after_tokens for it in items):
            raise RuntimeError(f"fault injected for testing after planning (prompt mentions {marker!r})")
        return planned

    setattr_(SpeculativeStep, "_plan", plan)
