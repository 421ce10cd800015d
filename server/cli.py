"""``specdec serve ...``: the command line (every flag also readable from ``SPECDEC_<FLAG>``).

Precedence: a flag on the command line, then its environment variable, then the default. An
environment value is checked exactly like the flag would be, so a typo fails at startup with the
variable's name instead of being ignored.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from server.settings import ServerSettings

ENV_PREFIX = "SPECDEC_"
GRACE_ENV = "SPECDEC_SHUTDOWN_GRACE"
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be in [0, 65535], got {value}")
    return value


def _log_level(text: str) -> str:
    value = text.lower()
    if value not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"must be one of {', '.join(LOG_LEVELS)}, got {text!r}")
    return value


_positive_int.__name__ = "integer >= 1"
_non_negative_int.__name__ = "integer >= 0"
_port.__name__ = "port"
_log_level.__name__ = "log level"


def env_name(dest: str) -> str:
    return ENV_PREFIX + dest.upper()


def _add_serve_arguments(p: argparse.ArgumentParser) -> None:
    model = p.add_argument_group("models")
    model.add_argument(
        "--model",
        help="target model: a local Hugging Face directory, a hub id already in the local HF cache, "
        "or a .gguf file (default: the embedded Qwen2.5-Coder 1.5B / 0.5B pair)",
    )
    model.add_argument("--draft-model", help="draft model for --speculative-method draft (same forms as --model)")
    model.add_argument(
        "--speculative-method",
        choices=("draft", "ngram", "none"),
        help="how tokens are proposed: 'draft' (a draft model), 'ngram' (lookup in the request's own "
        "tokens) or 'none' (default: draft when a draft model is given or for the default pair, else ngram)",
    )
    model.add_argument(
        "--num-speculative-tokens",
        type=_non_negative_int,
        help="draft tokens verified per step, k (default: the engine's, 4); requests may lower it",
    )
    model.add_argument(
        "--served-model-name",
        help="the model name clients send and /v1/models lists (default: the target's name)",
    )

    runtime = p.add_argument_group("runtime")
    runtime.add_argument("--device", choices=("auto", "cpu", "cuda"), help="where both models run (default: auto)")
    runtime.add_argument(
        "--dtype", choices=("auto", "float32", "bfloat16", "float16"), help="weight/activation dtype (default: auto)"
    )
    runtime.add_argument(
        "--quantize", choices=("auto", "none", "int8"),
        help="linear layers: int8 (per-row activation and per-channel weight scales, batch-invariant; CPU only), "
        "none (fp32 on CPU, bf16 on CUDA), auto = int8 on CPU, none on CUDA (default: auto)"
    )
    runtime.add_argument(
        "--max-num-seqs", type=_positive_int, help="requests decoded together in one batch (default: 8)"
    )
    runtime.add_argument(
        "--max-model-len", type=_positive_int, help="prompt + completion tokens per request (default: 2048)"
    )
    runtime.add_argument("--seed", type=int, help="engine seed for requests that give none")

    http = p.add_argument_group("http")
    http.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    http.add_argument("--port", type=_port, default=8000, help="port to listen on (default: 8000)")
    http.add_argument(
        "--max-queue",
        type=_non_negative_int,
        help="requests allowed to wait beyond --max-num-seqs running ones; more get 429 with "
        "Retry-After (default: unlimited)",
    )
    http.add_argument(
        "--api-key",
        help="require 'Authorization: Bearer KEY' on every /v1 route (/health and /metrics stay open); "
        f"prefer the {env_name('api_key')} variable, which keeps the key out of the process list",
    )
    http.add_argument(
        "--log-level", type=_log_level, default="info", help=f"one of {', '.join(LOG_LEVELS)} (default: info)"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specdec",
        description="OpenAI-compatible inference server with lossless speculative decoding.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve = sub.add_parser(
        "serve",
        help="serve a model over the OpenAI HTTP API",
        description="Serve a target model (and a draft model) over the OpenAI HTTP API: "
        "/v1/completions, /v1/chat/completions, /v1/models, /health, /metrics.",
        epilog=(
            f"Every flag can also be set as an environment variable {ENV_PREFIX}<FLAG> "
            f"(e.g. --max-num-seqs as {env_name('max_num_seqs')}); a flag given on the command line wins. "
            f"{GRACE_ENV} (seconds, default 30) bounds how long SIGTERM waits for in-flight requests. "
            "Per-request extensions in the JSON body: 'num_speculative_tokens' (int >= 0, caps k for that "
            "request; 0 turns speculation off), 'speculative': false (speculation off), 'top_k', "
            "'ignore_eos', 'stop_token_ids'."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_serve_arguments(serve)
    # Advertise each flag's variable in --help.
    for action in serve._actions:
        if action.dest not in ("help",) and action.option_strings:
            action.help = f"{action.help} [env: {env_name(action.dest)}]"
    return parser


def _apply_env_defaults(sub: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    """Turn ``SPECDEC_<FLAG>`` variables into defaults, validated like the flag itself."""
    for action in sub._actions:
        if not action.option_strings or action.dest == "help":
            continue
        name = env_name(action.dest)
        raw = env.get(name)
        if raw is None or raw == "":
            continue
        try:
            value: Any = action.type(raw) if action.type else raw
        except (argparse.ArgumentTypeError, ValueError) as exc:
            sub.error(f"environment variable {name}: invalid value {raw!r} ({exc})")
        if action.choices is not None and value not in action.choices:
            sub.error(f"environment variable {name}: {raw!r} is not one of {', '.join(map(str, action.choices))}")
        sub.set_defaults(**{action.dest: value})


def parse_serve_args(argv: Sequence[str], env: Mapping[str, str] | None = None) -> argparse.Namespace:
    """Parse ``serve`` arguments with environment defaults (exits with usage errors like argparse)."""
    parser = build_parser()
    env = os.environ if env is None else env
    sub = _serve_subparser(parser)
    _apply_env_defaults(sub, env)
    args = parser.parse_args(list(argv))
    if args.command != "serve":
        parser.print_help(sys.stderr)
        parser.exit(2)
    return args


def _serve_subparser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices["serve"]
    raise AssertionError("serve subcommand missing")


def settings_from_args(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> ServerSettings:
    """Build settings; unset engine flags keep ``EngineConfig``'s own defaults."""
    from specdec_core.config import EngineConfig

    from server.settings import ServerSettings

    env = os.environ if env is None else env
    engine_fields = (
        "model",
        "draft_model",
        "speculative_method",
        "num_speculative_tokens",
        "device",
        "dtype",
        "quantize",
        "max_num_seqs",
        "max_model_len",
        "seed",
    )
    engine_kwargs = {name: getattr(args, name) for name in engine_fields if getattr(args, name) is not None}
    try:
        engine = EngineConfig(**engine_kwargs)
    except ValueError as exc:
        raise SystemExit(f"specdec serve: error: {exc}") from None
    grace_raw = env.get(GRACE_ENV)
    try:
        grace = float(grace_raw) if grace_raw else 30.0
        if grace < 0:
            raise ValueError
    except ValueError:
        raise SystemExit(f"specdec serve: error: {GRACE_ENV} must be seconds >= 0, got {grace_raw!r}") from None
    return ServerSettings(
        engine=engine,
        host=args.host,
        port=args.port,
        api_key=args.api_key or None,
        served_model_name=args.served_model_name,
        max_queue=args.max_queue,
        log_level=args.log_level,
        shutdown_grace_s=grace,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point (``specdec``). Returns the process exit status."""
    args = parse_serve_args(sys.argv[1:] if argv is None else argv)
    settings = settings_from_args(args)
    from server.runner import serve

    return serve(settings)
