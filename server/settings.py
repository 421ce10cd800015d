"""Server settings: what the command line (or ``SPECDEC_*`` environment) decides, in one object."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # importing specdec_core pulls in torch; `specdec --help` should not wait for it
    from specdec_core.config import EngineConfig


def _default_engine_config() -> EngineConfig:
    from specdec_core.config import EngineConfig

    return EngineConfig()


@dataclass
class ServerSettings:
    """Everything the HTTP layer needs; ``engine`` is handed to the engine as is.

    ``served_model_name=None`` serves the engine's own model name. ``max_queue=None`` admits
    without limit; otherwise at most ``max_queue`` requests may wait beyond the engine's
    ``max_num_seqs`` running ones before new requests get 429. ``shutdown_grace_s`` is how long a
    SIGTERM waits for in-flight requests before aborting them (env ``SPECDEC_SHUTDOWN_GRACE``).
    """

    engine: EngineConfig = field(default_factory=_default_engine_config)
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    served_model_name: str | None = None
    max_queue: int | None = None
    log_level: str = "info"
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
