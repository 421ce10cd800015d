"""Structured logging: structlog for our events, stdlib records (uvicorn, transformers) alongside.

JSON lines when stderr is not a terminal (containers, log shippers), readable console lines when it
is. Everything, including uvicorn's and libraries' stdlib records, goes through one handler so the
format is uniform.
"""

from __future__ import annotations

import logging
import sys

import orjson
import structlog


def _orjson_dumps(obj: object, **_: object) -> str:
    return orjson.dumps(obj, default=str).decode()


def configure_logging(level: str = "info", json: bool | None = None) -> None:
    """Configure structlog and the stdlib root logger. ``json=None``: JSON iff stderr is no TTY."""
    if json is None:
        json = not sys.stderr.isatty()
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        numeric = logging.INFO

    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_logger_name,
        structlog.stdlib.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: structlog.types.Processor
    final: list[structlog.types.Processor]
    if json:
        renderer = structlog.processors.JSONRenderer(serializer=_orjson_dumps)
        final = [structlog.processors.format_exc_info, renderer]
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=False)
        final = [renderer]

    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=shared,
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *final],
        )
    )
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(numeric)
    # uvicorn installs its own handlers unless told otherwise; route them through ours. Its access
    # log is replaced by our one-line-per-request log (server.http.request_log).
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        lg = logging.getLogger(name)
        lg.handlers = []
        lg.propagate = True
    logging.getLogger("uvicorn.access").disabled = True
