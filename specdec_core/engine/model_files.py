"""The GGUF files an engine config names, checked before anything is loaded.

Why before: loading takes seconds to minutes, and a server answers 503 meanwhile; a file whose
header is malformed can be told in ~0.1 s (its header is parsed and checked, no tensor read), so
``specdec serve`` checks it before its port opens and exits with one line instead. The loader
checks every file again (and the tensors against the model) when it loads it; this only moves
the cheap part of that first. Light on purpose: no torch, no transformers.
"""

from __future__ import annotations

from pathlib import Path

from specdec_core.engine.config import EngineConfig
from specdec_core.loading.model_errors import ModelFileError

__all__ = ["ModelFileError", "check_model_files"]


def check_model_files(config: EngineConfig) -> None:
    """Parse and check the header of each ``.gguf`` file ``config`` names (target and draft);
    a malformed one raises ``ModelFileError``. Anything else (a directory, a hub id, a missing
    file) is left to the loader, which says what is wrong with it."""
    from specdec_core.loading.gguf_file import read_gguf

    for source in (config.model, config.draft_model):
        if source and source.endswith(".gguf") and Path(source).expanduser().is_file():
            read_gguf(Path(source).expanduser())
