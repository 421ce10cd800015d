#!/usr/bin/env python3
"""Stream a chat completion from a specdec server with the OpenAI Python SDK.

    python clients/openai_chat.py "Add type hints: def area(w, h): return w * h"
    python clients/openai_chat.py --system "You are terse." --max-tokens 64 "What is speculative decoding?"
    python clients/openai_chat.py --num-speculative-tokens 2 "Write a haiku about rain"

Tokens are printed as they arrive; at the end the server's ``speculative`` report (method, draft
tokens proposed and accepted, verify steps, acceptance rate, mean accepted length) and the usage
are printed to stderr. The API key is read from ``--api-key`` or ``SPECDEC_API_KEY`` /
``OPENAI_API_KEY`` (any string works when the server runs without ``--api-key``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from openai import OpenAI
from sdk_report import print_report, run_cli


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("prompt", nargs="?", default="Write a Python function that checks whether a number is prime.")
    p.add_argument("--system", default=None, help="optional system message")
    p.add_argument("--base-url", default=os.environ.get("SPECDEC_BASE_URL", "http://127.0.0.1:8000/v1"))
    p.add_argument("--api-key", default=os.environ.get("SPECDEC_API_KEY") or os.environ.get("OPENAI_API_KEY") or "none")
    p.add_argument("--model", default=None, help="model name (default: the first one in /v1/models)")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--num-speculative-tokens", type=int, default=None, help="per-request k (0 = no drafts)")
    p.add_argument("--no-speculation", action="store_true", help="send speculative=false for this request")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    client = OpenAI(base_url=args.base_url, api_key=args.api_key)
    model = args.model or client.models.list().data[0].id

    messages = []
    if args.system:
        messages.append({"role": "system", "content": args.system})
    messages.append({"role": "user", "content": args.prompt})

    # specdec's per-request extension fields travel in extra_body; unset sampling fields are not sent.
    extra: dict = {}
    if args.num_speculative_tokens is not None:
        extra["num_speculative_tokens"] = args.num_speculative_tokens
    if args.no_speculation:
        extra["speculative"] = False
    optional = {k: v for k, v in {"top_p": args.top_p, "seed": args.seed}.items() if v is not None}

    start = time.perf_counter()
    first: float | None = None
    speculative = usage = None
    stream = client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=extra or None,
        **optional,
    )
    for chunk in stream:
        for choice in chunk.choices:
            content = choice.delta.content if choice.delta else None
            if content:
                if first is None:
                    first = time.perf_counter()
                sys.stdout.write(content)
                sys.stdout.flush()
        # Unknown fields (specdec's "speculative") are kept by the SDK in model_extra.
        speculative = (chunk.model_extra or {}).get("speculative", speculative)
        usage = chunk.usage or usage
    print_report(model, start, first, usage, speculative)
    return 0


if __name__ == "__main__":
    run_cli(main)
