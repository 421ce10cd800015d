"""Server settings: what the command line (or ``SPECDEC_*`` environment) decides, in one object."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # importing specdec_core pulls in torch; `specdec --help` should not wait for it
    from specdec_core.config import EngineConfig


def _default_engine_config() -> EngineConfig:
    from specdec_core.config import EngineConfig

    return EngineConfig()


LogLevel = Literal["debug", "info", "warning", "error", "critical"]


def _flag(help: str, **extra: object) -> dict[str, object]:
    """``field`` metadata for a ``specdec serve`` flag (see ``server.config_flags``)."""
    return {"help": help, "group": "http", **extra}


@dataclass
class ServerSettings:
    """Everything the HTTP layer needs; ``engine`` is handed to the engine as is.

    ``served_model_name=None`` serves the engine's own model name. ``max_queue=None`` admits
    without limit; otherwise at most ``max_queue`` requests may wait beyond the engine's
    ``max_num_seqs`` running ones before new requests get 429. ``shutdown_grace_s`` is how long a
    SIGTERM waits for in-flight requests before aborting them (env ``SPECDEC_SHUTDOWN_GRACE``).
    """

    engine: EngineConfig = field(default_factory=_default_engine_config)
    host: str = field(default="127.0.0.1", metadata=_flag("address to listen on"))
    port: int = field(default=8000, metadata=_flag("port to listen on", minimum=0, maximum=65535))
    api_key: str | None = field(default=None, metadata=_flag(
        "require 'Authorization: Bearer KEY' on every /v1 route (/health and /metrics stay open); "
        "prefer the SPECDEC_API_KEY variable, which keeps the key out of the process list"))
    served_model_name: str | None = field(default=None, metadata=_flag(
        "the model name clients send and /v1/models lists", group="models", default_help="the target's name"))
    max_queue: int | None = field(default=None, metadata=_flag(
        "requests allowed to wait beyond --max-num-seqs running ones; more get 429 with Retry-After",
        minimum=0, default_help="unlimited"))
    log_level: LogLevel = field(default="info", metadata=_flag("server log level", ignore_case=True))
    shutdown_grace_s: float = 30.0
    # Requests larger than this are refused with 413 before they are parsed.
    max_body_bytes: int = 32 * 1024 * 1024

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def __repr__(self) -> str:  # never print the key (settings end up in logs and tracebacks)
        key = "'***'" if self.api_key else "None"
        return (
            f"ServerSettings(engine={self.engine!r}, host={self.host!r}, port={self.port}, api_key={key}, "
            f"served_model_name={self.served_model_name!r}, max_queue={self.max_queue}, "
            f"log_level={self.log_level!r}, shutdown_grace_s={self.shutdown_grace_s})"
        )
