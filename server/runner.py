"""Run the app under uvicorn, with SIGTERM meaning "drain, then exit 0".

uvicorn's own handling stops the server at once and re-raises the signal afterwards (so the
process dies *by* SIGTERM). A serving process should instead stop admitting (503), let in-flight
requests and streams finish within a grace period, end what is left (each stream with an error
event and ``data: [DONE]``, each waiting request with a 503), stop the engine at a step boundary,
wait for it, and exit 0. A second signal skips the grace period; a third one stops waiting for
connections.

The process never exits while a thread is inside torch (torch aborts it: "terminate called
without an active exception"): the engine is waited for, and a process stopped while the model
is still loading (or forced out) leaves with ``os._exit`` instead of running the interpreter's
teardown under the loading thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Iterator
from types import FrameType

import structlog
import uvicorn

from server.app import build_app
from server.http.protocol import protocol_for
from server.logging_setup import configure_logging
from server.settings import ServerSettings
from server.state import Phase, ServerState

log = structlog.get_logger("specdec.server")

# After the grace period, aborted requests get this long to send their final event.
ABORT_SETTLE_S = 5.0


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state: ServerState) -> None:
        super().__init__(config)
        self.state = state
        self.exit_code = 0
        self._signals = 0
        self._drain_task: asyncio.Task[None] | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        loop = asyncio.get_running_loop()
        handled = (signal.SIGINT, signal.SIGTERM)
        for sig in handled:
            loop.add_signal_handler(sig, self._on_signal, sig)
        try:
            yield
        finally:
            for sig in handled:
                loop.remove_signal_handler(sig)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """Say what listening means: uvicorn's own "running"/"startup complete" lines (filtered
        out, see ``UvicornStartupLines``) come before the model is loaded."""
        await super().startup(sockets)
        if not self.started:
            return
        url = self.state.settings.url
        if self.state.phase is Phase.LOADING:
            log.info(f"listening on {url}; the model is still loading: /health and generation answer 503 "
                     "until the 'ready' line", url=url)
        else:
            log.info(f"listening on {url}", url=url, phase=self.state.phase.value)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self._on_signal(signal.Signals(sig))

    def fatal(self, exit_code: int) -> None:
        """Stop now with ``exit_code`` (the engine could not be built)."""
        self.exit_code = exit_code
        self.should_exit = True

    def _on_signal(self, sig: signal.Signals) -> None:
        self._signals += 1
        if self._signals == 1:
            log.info(
                "shutdown requested: refusing new requests, draining in-flight ones",
                signal=sig.name,
                in_flight=len(self.state.in_flight),
                grace_s=self.state.settings.shutdown_grace_s,
            )
            self._drain_task = asyncio.get_running_loop().create_task(self._drain())
        else:
            log.warning("second shutdown signal: aborting in-flight requests", signal=sig.name)
            self.state.abort_all()
            self.should_exit = True
            if self._signals > 2:
                self.force_exit = True

    async def _drain(self) -> None:
        state = self.state
        if state.phase in (Phase.READY, Phase.LOADING):
            state.phase = Phase.DRAINING
        deadline = time.monotonic() + state.settings.shutdown_grace_s
        while state.in_flight and time.monotonic() < deadline and not self.should_exit:
            await asyncio.sleep(0.05)
        if state.in_flight:
            aborted = state.abort_all()
            log.warning("grace period over: aborted in-flight requests", aborted=aborted)
            settle = time.monotonic() + ABORT_SETTLE_S
            while state.in_flight and time.monotonic() < settle:
                await asyncio.sleep(0.05)
        log.info("drained; stopping")
        self.should_exit = True


class UvicornStartupLines(logging.Filter):
    """Drops uvicorn's startup lines ("Uvicorn running on ...", "Application startup complete."):
    they read as "ready" while the model is still loading. ``DrainingServer.startup`` logs what
    is true instead, and the app logs "ready" when the model is."""

    PREFIXES = ("Uvicorn running on", "Application startup complete", "Waiting for application startup")

    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and record.msg.startswith(self.PREFIXES))


def serve(settings: ServerSettings) -> int:
    """Run a server until it is told to stop; returns the process exit status."""
    configure_logging(settings.log_level)
    logging.getLogger("uvicorn.error").addFilter(UvicornStartupLines())
    if not sys.stderr.isatty():
        # Progress bars belong on a terminal, never inside JSON log lines; the loading phases log
        # their progress instead (specdec_core.loading.progress_log). tqdm reads this when it is imported,
        # which has not happened yet: the models are imported by the engine's loader.
        os.environ.setdefault("TQDM_DISABLE", "1")
    server: DrainingServer | None = None

    def on_fatal(code: int) -> None:
        if server is not None:
            server.fatal(code)

    app = build_app(settings, on_fatal=on_fatal)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        lifespan="on",
        log_config=None,
        log_level=settings.log_level,
        access_log=False,
        ws="none",
        server_header=False,
        # h11 with a head timeout, a connection limit and OpenAI error objects (server.http.protocol).
        http=protocol_for(settings),
        timeout_keep_alive=settings.keep_alive_timeout,
        # Our drain already waited for requests; this only bounds closing idle connections.
        timeout_graceful_shutdown=10,
    )
    server = DrainingServer(config, app.state.server)
    server.run()
    if app.state.engine_host.busy:
        # Stopped while the model was loading (or forced out of waiting for the engine): the
        # thread is inside torch, and the interpreter's teardown would abort the process under it.
        # Partial conversions are removed by the next start (specdec_core.loading.stale_partials).
        log.info("exiting without waiting for the engine thread", reason="still loading" if server.state.engine is None else "forced")
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(server.exit_code)
    return server.exit_code
