"""Runs inside LiteLLM's own virtual environment (tests/clients/test_client_litellm.py builds it): LiteLLM
needs its own pins, so it cannot be imported by the suite. Makes the calls docs/using-with-clients.md
describes with ``litellm.completion`` against the real server and writes what came back, as plain
JSON, to the file named by argv[2]; the test asserts on it. No assertions here, no network but the
server's: argv[1] is a JSON object with ``api_base``, ``model``, ``messages``, ``tools``,
``tool_choice`` and ``response_format``.
"""

from __future__ import annotations

import json
import sys

import litellm


def main() -> None:
    args = json.loads(sys.argv[1])
    common = dict(model="openai/" + args["model"], api_base=args["api_base"], api_key="none", temperature=0,
                  messages=args["messages"], num_retries=0, timeout=120)
    out: dict = {"litellm_version": _version("litellm"), "openai_version": _version("openai")}

    plain = litellm.completion(max_tokens=12, **common)
    out["plain"] = {"content": plain.choices[0].message.content, "finish_reason": plain.choices[0].finish_reason,
                    "usage": _usage(plain.usage)}

    chunks = list(litellm.completion(max_tokens=12, stream=True, stream_options={"include_usage": True}, **common))
    usage = [_usage(c.usage) for c in chunks if getattr(c, "usage", None) is not None]
    out["stream"] = {"content": "".join(c.choices[0].delta.content or "" for c in chunks if c.choices),
                     "chunks": len(chunks), "usage": usage[-1] if usage else None,
                     "finish_reason": next((c.choices[0].finish_reason for c in reversed(chunks)
                                            if c.choices and c.choices[0].finish_reason), None)}

    called = litellm.completion(max_tokens=200, tools=args["tools"], tool_choice=args["tool_choice"], **common)
    message = called.choices[0].message
    out["tool"] = {"content": message.content, "finish_reason": called.choices[0].finish_reason,
                   "tool_calls": [{"id": c.id, "type": c.type, "name": c.function.name, "arguments": c.function.arguments}
                                  for c in message.tool_calls or []]}

    structured = litellm.completion(max_tokens=200, response_format=args["response_format"], **common)
    out["structured"] = {"content": structured.choices[0].message.content,
                         "finish_reason": structured.choices[0].finish_reason}

    with open(sys.argv[2], "w") as f:
        json.dump(out, f)


def _usage(usage) -> dict | None:
    if usage is None:
        return None
    return {k: getattr(usage, k, None) for k in ("prompt_tokens", "completion_tokens", "total_tokens")}


def _version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)


if __name__ == "__main__":
    main()
