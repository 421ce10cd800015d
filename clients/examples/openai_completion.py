#!/usr/bin/env python3
"""Stream a text completion from a specdec server with the OpenAI Python SDK.

    python clients/examples/openai_completion.py "def fibonacci(n):"
    python clients/examples/openai_completion.py --max-tokens 64 --temperature 0.7 "Once upon a time"
    python clients/examples/openai_completion.py --no-speculation "Once upon a time"   # per-request off switch

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
    p.add_argument("prompt", nargs="?", default="def fibonacci(n):", help="the prompt text")
    add_common_arguments(p, max_tokens=128)
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    client = OpenAI(base_url=args.base_url, api_key=args.api_key)
    model = args.model or client.models.list().data[0].id

    start = time.perf_counter()
    first: float | None = None
    speculative = usage = None
    stream = client.completions.create(
        model=model,
        prompt=args.prompt,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=speculative_extra(args) or None,
        **optional_fields(args, ("top_p", "seed", "stop")),
    )
    for chunk in stream:
        for choice in chunk.choices:
            if choice.text:
                if first is None:
                    first = time.perf_counter()
                sys.stdout.write(choice.text)
                sys.stdout.flush()
        # Unknown fields (specdec's "speculative") are kept by the SDK in model_extra.
        speculative = (chunk.model_extra or {}).get("speculative", speculative)
        usage = chunk.usage or usage
    print_report(model, start, first, usage, speculative)
    return 0


if __name__ == "__main__":
    run_cli(main)
