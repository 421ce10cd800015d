"""Start-up phases tell the log what they do: start and end lines, and heartbeats in between from
the innermost running phase only. Every wait is on a logged line (an event), never on a duration."""

from __future__ import annotations

import logging
import threading

import pytest

import specdec_core.loading.progress_log as progress_log


class Recorder(logging.Handler):
    """Keeps every message; ``wait_for(text, n)`` blocks until ``n`` messages contain ``text``."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []
        self._changed = threading.Condition()

    def emit(self, record: logging.LogRecord) -> None:
        with self._changed:
            self.messages.append(record.getMessage())
            self._changed.notify_all()

    def wait_for(self, text: str, n: int = 1) -> None:
        with self._changed:
            assert self._changed.wait_for(lambda: sum(text in m for m in self.messages) >= n, timeout=60), self.messages


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(progress_log, "HEARTBEAT_S", 0.02)
    logger = logging.getLogger("test.progress_log")
    logger.setLevel(logging.INFO)
    handler = Recorder()
    logger.addHandler(handler)
    yield logger, handler
    logger.removeHandler(handler)


def test_a_phase_logs_start_heartbeats_with_progress_and_end(recorder) -> None:
    logger, rec = recorder
    status = {"done": 0}
    with progress_log.phase(logger, "copying things", lambda: f"{status['done']} / 3 things"):
        rec.wait_for("still copying things")
        status["done"] = 2
        rec.wait_for("2 / 3 things")
    assert rec.messages[0] == "copying things"
    assert rec.messages[-1].startswith("copying things: done in ")
    beats = rec.messages[1:-1]
    assert beats and all(m.startswith("still copying things (") for m in beats)


def test_only_the_innermost_phase_beats(recorder) -> None:
    logger, rec = recorder
    with progress_log.phase(logger, "outer"):
        with progress_log.phase(logger, "inner"):
            rec.wait_for("still inner", 3)
        inner_end = len(rec.messages)
        rec.wait_for("still outer")
    inside = rec.messages[rec.messages.index("inner"): inner_end]
    assert not any(m.startswith("still outer") for m in inside), inside
    assert rec.messages[-1].startswith("outer: done in ")


def test_a_failing_phase_logs_no_done_line(recorder) -> None:
    logger, rec = recorder
    with pytest.raises(RuntimeError), progress_log.phase(logger, "doomed"):
        raise RuntimeError("no")
    assert rec.messages == ["doomed"]
