"""Run the app under uvicorn, with SIGTERM meaning "drain, then exit 0".

uvicorn's own handling stops the server at once and re-raises the signal afterwards (so the
process dies *by* SIGTERM). A serving process should instead stop admitting (503), let in-flight
requests and streams finish within a grace period, abort what is left, and exit cleanly. A second
signal skips the grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Iterator
from types import FrameType

import structlog
import uvicorn

from server.app import build_app
from server.http_protocol import protocol_for
from server.logging import configure_logging
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


def serve(settings: ServerSettings) -> int:
    """Run a server until it is told to stop; returns the process exit status."""
    configure_logging(settings.log_level)
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
        # h11 with a head timeout, a connection limit and OpenAI error objects (server.http_protocol).
        http=protocol_for(settings),
        timeout_keep_alive=settings.keep_alive_timeout,
        # Our drain already waited for requests; this only bounds closing idle connections.
        timeout_graceful_shutdown=10,
    )
    server = DrainingServer(config, app.state.server)
    server.run()
    return server.exit_code
