"""Clean-up of interrupted writes in the model cache.

Both the default pair's header-only GGUF (``default_models``) and the safetensors conversion (``loader``) write under
``.<name>.tmp-<pid>`` and rename into place; a killed process leaves its temporary behind.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def remove_stale_partials(directory: Path) -> None:
    """Delete ``.*.tmp-<pid>`` leftovers of interrupted writes whose process is gone."""
    for partial in directory.glob(".*.tmp-*"):
        pid = partial.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not _pid_alive(int(pid)):
            if partial.is_dir():
                shutil.rmtree(partial, ignore_errors=True)
            else:
                partial.unlink(missing_ok=True)


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
