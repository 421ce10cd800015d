"""What the OpenAI-SDK example clients share: the end-of-stream report and the CLI error exits.

The clients run as scripts (``python clients/openai_chat.py``), so they import this module by its
sibling name: the script's folder is on ``sys.path``.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any

import openai


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
