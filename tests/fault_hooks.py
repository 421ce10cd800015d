"""A test-only fault: every engine request whose prompt text mentions a marker fails while being
committed, after its batch's forward and verification. The engine itself has no such hook; tests
patch it in (in-process with pytest's monkeypatch, or in a server through ``held_step_server.py``'s
``FAULT_MARKER``), to prove that one request's failure leaves the others running."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import specdec_core.engine.engine as engine_module


def fail_requests_mentioning(marker: str, setattr_: Callable[[Any, str, Any], None] = setattr) -> None:
    """Patch ``Engine`` so requests whose prompt decodes to text containing ``marker`` fail at
    commit; ``setattr_`` is ``monkeypatch.setattr`` where the patch must be undone after a test."""
    Engine = engine_module.Engine
    real_make, real_commit = Engine.make_request, Engine._commit
    faulty: set[str] = set()

    def make_request(self: Any, prompt: Any, params: Any, request_id: str | None = None) -> Any:
        req = real_make(self, prompt, params, request_id)
        if marker in self.tokenizer.decode(req.prompt_ids):
            faulty.add(req.request_id)
        return req

    def commit(self: Any, req: Any, *args: Any, **kwargs: Any) -> Any:
        if req.request_id in faulty:
            faulty.discard(req.request_id)
            raise RuntimeError(f"fault injected for testing (prompt mentions {marker!r})")
        return real_commit(self, req, *args, **kwargs)

    setattr_(Engine, "make_request", make_request)
    setattr_(Engine, "_commit", commit)
