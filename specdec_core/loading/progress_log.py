"""Long start-up phases told in the log: a line when a phase starts, a heartbeat while it runs, a
line when it ends.

Loading the default pair took minutes on a CPU (checking its GGUF parts, dequantizing them, writing
safetensors, loading, preparing kernels, calibrating), and several of those are single library
calls with nothing to report. A log that goes quiet for two minutes reads like a hang, and
progress bars are no answer in a container: they belong on a terminal only, never inside JSON log
lines. So every phase logs at info when it starts and ends, and while it runs the innermost phase
logs ``still <phase> (N s[, progress])`` whenever nothing was logged for ``HEARTBEAT_S``; the log is
then never silent for longer than that, whatever the library under it does.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator

# Longest silence a running phase allows itself.
HEARTBEAT_S = 10.0

_lock = threading.Lock()
_active: list[_Phase] = []  # innermost last; only the innermost phase beats
_last_line = 0.0  # time.monotonic() of the last line any phase logged


def bars_enabled(progress: bool) -> bool:
    """Progress bars only when asked for and stderr is a terminal (never in JSON log lines)."""
    return progress and sys.stderr.isatty()


class _Phase:
    def __init__(self, logger: logging.Logger, description: str, progress: Callable[[], str] | None) -> None:
        self.logger = logger
        self.description = description
        self.progress = progress
        self.started = time.monotonic()
        self._done = threading.Event()

    def say(self, message: str, *args: object) -> None:
        global _last_line
        self.logger.info(message, *args)
        _last_line = time.monotonic()

    def beat(self) -> None:
        while not self._done.wait(HEARTBEAT_S / 4):
            with _lock:
                now = time.monotonic()
                if not _active or _active[-1] is not self or now - _last_line < HEARTBEAT_S:
                    continue
                detail = f", {self.progress()}" if self.progress is not None else ""
                self.say("still %s (%.0f s%s)", self.description, now - self.started, detail)

    def stop(self) -> None:
        self._done.set()


@contextlib.contextmanager
def phase(logger: logging.Logger, description: str, progress: Callable[[], str] | None = None) -> Iterator[None]:
    """Log ``description`` now, heartbeats while the block runs (see the module docstring), and
    ``<description>: done in N s`` when it ends (nothing more if it raises: the error says why).
    ``progress`` returns a short status for the heartbeat, e.g. ``"0.4 / 1.1 GB"``."""
    current = _Phase(logger, description, progress)
    with _lock:
        current.say("%s", description)
        _active.append(current)
    beater = threading.Thread(target=current.beat, name="specdec-progress-log", daemon=True)
    beater.start()
    ok = False
    try:
        yield
        ok = True
    finally:
        current.stop()
        beater.join()
        with _lock:
            _active.remove(current)
            if ok:
                current.say("%s: done in %.1f s", description, time.monotonic() - current.started)
