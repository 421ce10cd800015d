"""Spawned servers: one ``python -m server serve`` per speculation mode, on a free loopback port."""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from .modes import MODE_TO_METHOD, NEEDS_DRAFT
from .progress import log

REPO_ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SpawnedServer:
    """``python -m server serve`` for one mode on a free loopback port, logging to a file."""

    def __init__(self, mode: str, args, log_dir: Path, name: str = "") -> None:
        self.mode = mode
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_dir / f"server-{mode}{name}.log"
        cmd = [sys.executable, "-m", "server", "serve", "--host", "127.0.0.1", "--port", str(self.port),
               "--speculative-method", MODE_TO_METHOD[mode],
               "--device", args.device, "--dtype", args.dtype, "--quantize", args.quantize,
               "--max-num-seqs", str(args.max_num_seqs or max(args.concurrency))]
        if args.model:
            cmd += ["--model", args.model]
        if args.draft_model and mode in NEEDS_DRAFT:
            cmd += ["--draft-model", args.draft_model]
        if args.max_model_len:
            cmd += ["--max-model-len", str(args.max_model_len)]
        if args.num_speculative_tokens is not None and mode != "off":
            cmd += ["--num-speculative-tokens", str(args.num_speculative_tokens)]
        cmd += args.server_arg
        self.cmd = cmd
        self.api_key = args.api_key
        self.proc: subprocess.Popen | None = None
        self._log = None

    def start(self) -> None:
        log(f"starting {self.mode} server: {shlex.join(self.cmd)} (log: {self.log_path})")
        self._log = open(self.log_path, "wb")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        if self.api_key:  # through the environment: keeps the key out of the process list
            env["SPECDEC_API_KEY"] = self.api_key
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                     cwd=REPO_ROOT, start_new_session=True)

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        next_note = time.monotonic() + 30
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.mode} server exited with code {self.proc.returncode}:\n{self.tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200 and self._calibrated():
                    log(f"{self.mode} server ready at {self.url}")
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.mode} server not healthy after {timeout:.0f}s:\n{self.tail()}")
            if time.monotonic() > next_note:
                log(f"waiting for the {self.mode} server (loading models; last log line: {self.tail(1).strip()!r})")
                next_note = time.monotonic() + 30
            time.sleep(1.0)

    def _calibrated(self) -> bool:
        """A server does some start-up work after its ready line, while idle (a first start's
        calibration, a later one's warm-up, the tokenizer view for structured output): the
        measurement waits for it to end (it would sit between the first requests)."""
        text = self.log_path.read_text(errors="replace")
        owed = {"step costs provisional": "step costs measured while idle",
                "warmed up while the engine is idle": "step shapes warmed up while idle",
                "is built while the engine is idle": "view of the tokenizer while idle: done"}
        return "failed; serving on the step costs" in text or all(done in text for begun, done in owed.items()
                                                                   if begun in text)

    def tail(self, n: int = 20) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                log(f"{self.mode} server ignored SIGTERM for 60s; killing it")
                self.proc.kill()
                self.proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
