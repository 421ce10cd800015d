"""The agentic workload: multi-turn coding-agent sessions (``clients/agentic.json``).

Each session takes one source file through review -> fix -> rename -> docstrings; every turn
re-sends the whole history, the model's own earlier answers included, and asks for the complete
file again in the same tool-call JSON shape. That is the traffic suffix decoding targets: a turn's
answer repeats the history (the request's own trie), and the tool calls repeat each other across
sessions (the global trie). A session is measured as one unit: its turns run one after another,
each built from the previous answers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Awaitable, Callable

from .results import RequestResult

SESSIONS_FILE = Path(__file__).resolve().parent.parent / "agentic.json"


def load_sessions() -> list[dict[str, Any]]:
    """The sessions, each with its system prompt and turn templates filled in."""
    data = json.loads(SESSIONS_FILE.read_text())
    return [{"system": data["system"], "turns": [t.format(**s) for t in data["turns"]], "path": s["path"]}
            for s in data["sessions"]]


Send = Callable[[list[dict[str, str]]], Awaitable[RequestResult]]


async def run_session(session: dict[str, Any], send: Send) -> list[RequestResult]:
    """The session's turns in order; a turn's messages are the system prompt, every earlier turn
    and answer, and its own request. Stops at the first failed turn (later turns need its answer)."""
    messages = [{"role": "system", "content": session["system"]}]
    results: list[RequestResult] = []
    for turn in session["turns"]:
        messages.append({"role": "user", "content": turn})
        res = await send(list(messages))
        results.append(res)
        if not res.ok:
            break
        messages.append({"role": "assistant", "content": res.text})
    return results
