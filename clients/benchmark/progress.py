"""Log lines and per-level progress bars on stderr (the table and the results go to stdout)."""

from __future__ import annotations

import sys
import time


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class _LineProgress:
    """Progress as plain log lines (for logs and pipes, where a redrawn bar is noise)."""

    def __init__(self, total: int, desc: str) -> None:
        self.total, self.desc, self.n = total, desc, 0
        self.start = time.perf_counter()
        self.step = max(1, total // 4)

    def update(self, k: int = 1) -> None:
        self.n += k
        if self.n == self.total or self.n % self.step == 0:
            log(f"{self.desc.strip()}: {self.n}/{self.total} requests, {time.perf_counter() - self.start:.1f}s")

    def close(self) -> None:
        pass


def progress(total: int, desc: str):
    if sys.stderr.isatty():
        try:
            from tqdm import tqdm

            return tqdm(total=total, desc=desc, file=sys.stderr, leave=True, mininterval=0.5, dynamic_ncols=True)
        except ImportError:  # pragma: no cover - tqdm is a dependency of specdec
            pass
    return _LineProgress(total, desc)
