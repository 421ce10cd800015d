"""What the OpenAI-SDK example clients share: their common flags, specdec's extension fields, the
end-of-stream report and the CLI error exits.

The clients run as scripts (``python clients/examples/openai_chat.py``), so they import this module by its
sibling name: the script's folder is on ``sys.path``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import openai


def add_common_arguments(p: argparse.ArgumentParser, max_tokens: int) -> None:
    """Server, model and sampling flags both clients take."""
    p.add_argument("--base-url", default=os.environ.get("SPECDEC_BASE_URL", "http://127.0.0.1:8000/v1"))
    p.add_argument("--api-key", default=os.environ.get("SPECDEC_API_KEY") or os.environ.get("OPENAI_API_KEY") or "none")
    p.add_argument("--model", default=None, help="model name (default: the first one in /v1/models)")
    p.add_argument("--max-tokens", type=int, default=max_tokens)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--num-speculative-tokens", type=int, default=None, help="per-request k (0 = no drafts)")
    p.add_argument("--no-speculation", action="store_true", help="send speculative=false for this request")


def speculative_extra(args: argparse.Namespace) -> dict:
    """specdec's per-request extension fields, sent through the SDK's ``extra_body``."""
    extra: dict = {}
    if args.num_speculative_tokens is not None:
        extra["num_speculative_tokens"] = args.num_speculative_tokens
    if args.no_speculation:
        extra["speculative"] = False
    return extra


def optional_fields(args: argparse.Namespace, names: tuple[str, ...] = ("top_p", "seed")) -> dict:
    """Only the sampling fields the user set, so the server applies its own defaults otherwise."""
    return {k: getattr(args, k) for k in names if getattr(args, k) is not None}


def print_report(model: str, start: float, first: float | None, usage: Any, speculative: Any) -> None:
    """Print the timings, the usage and the server's ``speculative`` report as JSON to stderr.

    ``start`` and ``first`` (the first token's arrival, or None) are ``time.perf_counter()`` values;
    the total time is measured up to now.
    """
    elapsed = time.perf_counter() - start
    sys.stdout.write("\n")

    report = {
        "model": model,
        "time_to_first_token_s": None if first is None else round(first - start, 4),
        "total_time_s": round(elapsed, 4),
        "usage": usage.model_dump() if usage is not None else None,
        "speculative": speculative,
    }
    print(json.dumps(report, indent=2), file=sys.stderr)


def run_cli(main: Callable[[], int]) -> None:
    """Run ``main`` and exit with its status, turning SDK errors and Ctrl-C into short exits."""
    try:
        sys.exit(main())
    except openai.APIConnectionError as exc:
        sys.exit(f"error: cannot reach the server ({exc}); is `specdec serve` running? (--base-url)")
    except openai.APIStatusError as exc:
        sys.exit(f"error: HTTP {exc.status_code}: {exc.message}")
    except KeyboardInterrupt:
        sys.exit(130)
