"""Where specdec keeps what it builds or converts on disk: the compiled C library, converted GGUF
weights, the default pair's checked headers. In kernels/, the lowest package, because the C
library's loader (``c_library``, which compiles into it on first use) needs it and may import
nothing above it; the engine's config takes its default from here."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_DIR_ENV = "SPECDEC_CACHE_DIR"


def default_cache_dir() -> Path:
    """Where converted GGUF weights and the default pair's checked headers live (overridable by env)."""
    root = os.environ.get(CACHE_DIR_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "specdec"
    )
    return Path(root)
