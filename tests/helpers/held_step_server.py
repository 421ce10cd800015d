"""``specdec serve`` with test hooks that keep the engine busy inside torch on cue (test code only).

The shutdown tests need SIGTERM to arrive while the engine thread is inside a long step, or while
the model is loading, on a machine of any speed. The hooks patch this process only, so nothing of
them is in the product:

- ``HELD_STEP_AFTER=N``: once N engine requests have received tokens, the next ``Engine.step``
  holds, busy in torch like a long prefill, until the line ``release`` arrives on stdin;
- ``HELD_LOAD=1``: loading a model holds the same way and is never released;
- ``FAULT_MARKER=<text>``: every request whose prompt mentions the text fails while being
  committed (``fault_hooks.py`` beside this file), to prove that one request's failure leaves the
  others running.

Each hook says where it is on stdout (the server log): ``held-step: holding``,
``held-step: released``, ``held-load: holding``.

Usage, from the repository root: ``python -m tests.helpers.held_step_server serve [flags]``
(``ServerProcess(..., entry=HELD_STEP_ENTRY)`` in ``tests/helpers/servers.py``).
"""

from __future__ import annotations

import os
import sys
import threading

import torch

import specdec_core.engine.engine as engine_module
import specdec_core.loading.loader as loader
from tests.helpers.fault_hooks import fail_requests_mentioning

_released = threading.Event()


def _busy_until_released(what: str) -> None:
    print(f"{what}: holding", flush=True)
    x = torch.ones(256, 256)
    while not _released.is_set():
        # Real torch work, as in a long step: a process that exits under it is aborted by torch.
        x = torch.tanh(x @ x)
    print(f"{what}: released", flush=True)


def _hold_step_after(n: int) -> None:
    real_step = engine_module.Engine.step
    with_tokens: set[str] = set()

    def step(self: engine_module.Engine) -> list:
        if len(with_tokens) >= n and not _released.is_set():
            _busy_until_released("held-step")
        outputs = real_step(self)
        with_tokens.update(out.request_id for out in outputs if out.token_ids)
        return outputs

    engine_module.Engine.step = step  # type: ignore[method-assign]


def _hold_load() -> None:
    def load_model(*args: object, **kwargs: object) -> object:
        _busy_until_released("held-load")
        raise RuntimeError("held load released")

    loader.load_model = load_model  # Engine imports it from the module at build time


def _read_commands() -> None:
    for line in sys.stdin:
        if line.strip() == "release":
            _released.set()


def main() -> int:
    if os.environ.get("HELD_STEP_AFTER"):
        _hold_step_after(int(os.environ["HELD_STEP_AFTER"]))
    if os.environ.get("HELD_LOAD"):
        _hold_load()
    if os.environ.get("FAULT_MARKER"):
        fail_requests_mentioning(os.environ["FAULT_MARKER"])
    threading.Thread(target=_read_commands, name="held-step-commands", daemon=True).start()
    from server.cli import main as cli_main

    return cli_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
