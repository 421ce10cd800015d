"""Time to ready, peak memory and disk written by ``specdec serve``: a first start (empty cache
directory) and a later one (the same directory), for any model argument.

    python clients/tools/startup.py --model path/to/model.gguf [--model other.gguf] [--runs 2] [-- serve flags]
    python clients/tools/startup.py --model default          # the embedded pair (no --model)
    python clients/tools/startup.py --model m.gguf --peer build/bin/llama-server --peer-arg=-t --peer-arg=2

Each start is a fresh process on a free loopback port, polled on ``/health`` until it answers
200; "peak RSS" is the server process's VmHWM at that moment; "costs s" is when its step costs
were saved (a first start becomes ready before its calibration ends, which runs while the
server is idle; the start is kept running until then, so that the next one finds them);
"written" the bytes under its
``SPECDEC_CACHE_DIR`` (the cache is the only place specdec writes to). ``--peer`` starts
llama.cpp's ``llama-server`` on the same GGUF file after ours, ``--runs`` times, timed the same
way (its ``/health`` answers 503 until the model is loaded); compare only numbers from one run.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def time_to_ready(cmd: list[str], port: int, env: dict[str, str], timeout: float,
                  settled: Callable[[], bool] = lambda: True) -> dict:
    """Start ``cmd`` (a server on ``port``) and poll its ``/health`` until 200: seconds and peak RSS;
    then, before stopping it, until ``settled()`` (seconds from the start to that too)."""
    began = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited with {proc.returncode} before it was ready: {' '.join(cmd)}")
            if time.monotonic() - began > timeout:
                raise RuntimeError(f"not ready within {timeout:.0f} s")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        ready = {"ready_s": time.monotonic() - began, "peak_rss": peak_rss(proc.pid)}
        while not settled() and proc.poll() is None and time.monotonic() - began < timeout:
            time.sleep(0.2)
        return {**ready, "settled_s": time.monotonic() - began}
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def start(model: str, cache: Path, extra: list[str], timeout: float) -> dict:
    """One ``specdec serve`` start to ready: seconds, peak RSS and cache bytes after it."""
    port = free_port()
    cmd = [sys.executable, "-m", "server", "serve", "--host", "127.0.0.1", "--port", str(port), *extra]
    if model != "default":
        cmd += ["--model", model]
    # A first start is ready before its calibration ends (it runs while the server is idle) and
    # saves the step costs when it does: the start is kept running until then, or the next would
    # calibrate again.
    def saved() -> bool:
        return any((cache / "step-costs").glob("*.json"))

    ready = time_to_ready(cmd, port, {**os.environ, "SPECDEC_CACHE_DIR": str(cache)}, timeout, saved)
    return {**ready, "written": tree_bytes(cache)}


def start_peer(peer: str, model: str, extra: list[str], timeout: float) -> dict:
    """One ``llama-server`` start on the same file (it writes nothing)."""
    port = free_port()
    cmd = [peer, "-m", model, "--host", "127.0.0.1", "--port", str(port), *extra]
    return {**time_to_ready(cmd, port, dict(os.environ), timeout), "written": 0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", required=True, help="a model argument, or 'default'")
    parser.add_argument("--runs", type=int, default=2, help="starts per model: the first on an empty cache")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--peer", default=None, help="a llama-server binary, started on each .gguf model after ours")
    parser.add_argument("--peer-arg", action="append", default=[], help="an argument for the peer (repeatable)")
    parser.add_argument("serve_args", nargs="*", help="flags passed to specdec serve (after --)")
    args = parser.parse_args(argv)
    print(f"{'model':40} {'start':>6} {'ready s':>8} {'costs s':>8} {'peak RSS GB':>12} {'written MB':>11} {'file MB':>8}")
    for model in args.model:
        size = Path(model).stat().st_size / 1e6 if model != "default" else float("nan")
        with tempfile.TemporaryDirectory(prefix="specdec-startup-") as tmp:
            for run in range(args.runs):
                r = start(model, Path(tmp), args.serve_args, args.timeout)
                print(row(Path(model).name, "first" if run == 0 else "later", r, size), flush=True)
        if args.peer and model.endswith(".gguf"):
            for _ in range(args.runs):
                print(row(f"llama-server {Path(model).name}", "", start_peer(args.peer, model, args.peer_arg, args.timeout),
                          size), flush=True)
    return 0


def row(name: str, which: str, r: dict, size: float) -> str:
    return (f"{name:40} {which:>6} {r['ready_s']:8.1f} {r['settled_s']:8.1f} {r['peak_rss'] / 1e9:12.2f} "
            f"{r['written'] / 1e6:11.1f} {size:8.0f}")


if __name__ == "__main__":
    sys.exit(main())
