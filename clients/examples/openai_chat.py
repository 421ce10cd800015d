#!/usr/bin/env python3
"""Stream a chat completion from a specdec server with the OpenAI Python SDK.

    python clients/examples/openai_chat.py "Add type hints: def area(w, h): return w * h"
    python clients/examples/openai_chat.py --system "You are terse." --max-tokens 64 "What is speculative decoding?"
    python clients/examples/openai_chat.py --num-speculative-tokens 2 "Write a haiku about rain"

Tokens are printed as they arrive; at the end the server's ``speculative`` report (method, draft
tokens proposed and accepted, verify steps, acceptance rate, mean accepted length) and the usage
are printed to stderr. The API key is read from ``--api-key`` or ``SPECDEC_API_KEY`` /
``OPENAI_API_KEY`` (any string works when the server runs without ``--api-key``).
"""

from __future__ import annotations

import argparse
import sys
import time

from openai import OpenAI
from sdk_report import add_common_arguments, optional_fields, print_report, run_cli, speculative_extra


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("prompt", nargs="?", default="Write a Python function that checks whether a number is prime.")
    p.add_argument("--system", default=None, help="optional system message")
    add_common_arguments(p, max_tokens=256)
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
    extra = speculative_extra(args)
    optional = optional_fields(args)

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
