"""Codex CLI and Claude Code, the real clients from npm, against a real server.

Each runs its one-shot task non-interactively against ``specdec serve`` on a loopback port, as
docs/using-with-clients.md configures it (telemetry off, a scratch HOME): it must finish without a
client-side error, and every answer the server gave it must be 2xx (the server's own request log
says). The model is a tiny random one whose answers end after a few tokens (``short_answers_copy``):
these tests check the protocol (the clients' real request shapes: 40-80 KB bodies, system and
developer messages between turns, namespace, custom and hosted tools, streaming), not the answers.
The recorded bodies of real sessions are checked fast in ``tests/server/test_agent_requests.py``.

The clients come pinned from the npm registry; without node and npm, or when the registry cannot
be reached, the tests skip and say why.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers.servers import AGENT_CONTEXT, AGENT_MODEL, ServerProcess

CODEX, CLAUDE_CODE = "@openai/codex@0.169.0", "@anthropic-ai/claude-code@2.1.328"
TASK = "Create a file hello.py that prints hello world, then run it"
MODEL, CONTEXT = AGENT_MODEL, AGENT_CONTEXT
CLIENT_TIMEOUT_S = 600  # a hung client fails the test rather than the run


@pytest.fixture(scope="module")
def npm_clients(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The pinned clients installed into a scratch folder (its ``node_modules``)."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are needed to install Codex CLI and Claude Code from npm")
    prefix = tmp_path_factory.mktemp("agent_clients")
    env = {**os.environ, "npm_config_cache": str(prefix / ".npm"), "npm_config_update_notifier": "false"}
    done = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--prefix", str(prefix), CODEX, CLAUDE_CODE],
                          capture_output=True, text=True, env=env, timeout=900)
    if done.returncode != 0:
        pytest.skip(f"npm could not install {CODEX} and {CLAUDE_CODE}: {done.stderr[-800:]}")
    return prefix / "node_modules"


def requests_logged(server: ServerProcess, since: int) -> list[dict]:
    """The server's request log lines written after byte ``since`` of its log."""
    text = server.log_path.read_bytes()[since:].decode(errors="replace")
    lines = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("event") == "request"]


def run_client(cmd: list[str], home: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    work = home / "work"
    work.mkdir(parents=True)
    return subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=CLIENT_TIMEOUT_S, stdin=subprocess.DEVNULL,
                          env={"PATH": os.environ["PATH"], "HOME": str(home), **env})


def test_claude_code_finishes_its_task(npm_clients: Path, agent_server: ServerProcess, tmp_path: Path) -> None:
    since = agent_server.log_path.stat().st_size
    # npm 11 runs no install scripts it was not told to trust: the wrapper finds the platform binary
    wrapper = npm_clients / "@anthropic-ai" / "claude-code" / "cli-wrapper.cjs"
    done = run_client(["node", str(wrapper), "-p", TASK, "--max-turns", "3"], tmp_path, {
        "ANTHROPIC_BASE_URL": agent_server.url, "ANTHROPIC_AUTH_TOKEN": "unused", "ANTHROPIC_MODEL": MODEL,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": MODEL, "ANTHROPIC_DEFAULT_SONNET_MODEL": MODEL,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": MODEL, "CLAUDE_CODE_MAX_CONTEXT_TOKENS": str(CONTEXT),
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1", "DISABLE_ERROR_REPORTING": "1",
    })
    logged = requests_logged(agent_server, since)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:], logged)
    messages = [r for r in logged if r["path"] == "/v1/messages"]
    assert messages and all(r["status"] < 300 for r in logged), logged
    # Every request repeats the long system prompt and tools after the billing header whose cch
    # changes: with the header kept out, later requests read that prefix from the cache.
    assert any(r.get("cached_tokens", 0) > 0 for r in messages[1:]) or len(messages) == 1, messages


def test_codex_finishes_its_task(npm_clients: Path, agent_server: ServerProcess, tmp_path: Path) -> None:
    since = agent_server.log_path.stat().st_size
    codex_home = tmp_path / ".codex"
    codex_home.mkdir()
    (codex_home / "config.toml").write_text(f'''
model = "{MODEL}"
model_provider = "specdec"
model_context_window = {CONTEXT}

[model_providers.specdec]
name = "specdec"
base_url = "{agent_server.url}/v1"
env_key = "SPECDEC_API_KEY"
wire_api = "responses"

[analytics]
enabled = false

[feedback]
enabled = false

[otel]
exporter = "none"
trace_exporter = "none"
metrics_exporter = "none"
''')
    codex = npm_clients / ".bin" / "codex"
    done = run_client([str(codex), "exec", "--skip-git-repo-check", "--sandbox", "workspace-write", TASK], tmp_path,
                      {"CODEX_HOME": str(codex_home), "SPECDEC_API_KEY": "unused"})
    logged = requests_logged(agent_server, since)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:], logged)
    assert [r for r in logged if r["path"] == "/v1/responses"] and all(r["status"] < 300 for r in logged), logged
