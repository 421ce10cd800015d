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

from server.cli_flags import (
    add_flags,
    engine_config_class,
    flag_fields,
    given_values,
    parse_env_bool,
)

if TYPE_CHECKING:
    from server.settings import ServerSettings

ENV_PREFIX = "SPECDEC_"
GRACE_ENV = "SPECDEC_SHUTDOWN_GRACE"
# --help sections, in this order; a field's metadata names its section.
GROUPS = ("models", "runtime", "http")


def env_name(dest: str) -> str:
    return ENV_PREFIX + dest.upper()


def _flag_classes() -> tuple[type, type, dict[str, Any]]:
    """``EngineConfig`` and ``ServerSettings`` (whose flags are generated from their fields), and
    the names ``ServerSettings``' annotations need resolved."""
    from server.settings import ServerSettings

    engine_config = engine_config_class()
    return engine_config, ServerSettings, {"EngineConfig": engine_config}


def _add_serve_arguments(p: argparse.ArgumentParser) -> None:
    """One flag per ``EngineConfig`` and ``ServerSettings`` field that has help metadata."""
    groups = {name: p.add_argument_group(name) for name in GROUPS}
    engine_config, server_settings, localns = _flag_classes()

    def group(name: str) -> argparse._ArgumentGroup:
        if name not in groups:
            groups[name] = p.add_argument_group(name)
        return groups[name]

    add_flags(group, engine_config)
    add_flags(group, server_settings, localns)


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
            "An --x/--no-x flag's variable takes 1/0, true/false, yes/no or on/off. "
            f"{GRACE_ENV} (seconds, default 30) bounds how long SIGTERM waits for in-flight requests. "
            "Per-request extensions in the JSON body: 'num_speculative_tokens' (int >= 0, caps k for that "
            "request; 0 turns speculation off), 'speculative': false (speculation off), 'top_k', "
            "'ignore_eos', 'stop_token_ids'."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_serve_arguments(serve)
    serve_ray = sub.add_parser(
        "serve-ray",
        help="serve replicas of the same server behind Ray Serve (needs the 'ray' extra)",
        description="The server of 'specdec serve' as a Ray Serve deployment: one replica per device "
        "(a GPU each where there are GPUs, a share of the CPU cores otherwise) behind Ray Serve's HTTP "
        "proxy at --host:--port, fixed (--num-replicas) or autoscaled on ongoing requests "
        "(--min-replicas/--max-replicas). Takes every 'serve' flag; each replica gets them.",
        epilog=serve.epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_serve_arguments(serve_ray)
    ray = serve_ray.add_argument_group("ray")
    ray.add_argument("--num-replicas", type=_positive_int, default=None,
                     help="a fixed number of replicas (default: autoscale between --min-replicas and --max-replicas)")
    ray.add_argument("--min-replicas", type=_positive_int, default=1, help="autoscaling lower bound (default 1)")
    ray.add_argument("--max-replicas", type=_positive_int, default=1, help="autoscaling upper bound (default 1)")
    ray.add_argument("--target-ongoing-requests", type=float, default=None,
                     help="autoscaling target per replica (default: --max-num-seqs, a full batch)")
    ray.add_argument("--cpus-per-replica", type=float, default=None,
                     help="CPU cores (and torch threads) per replica (default: cores / replicas, 1 with GPUs)")
    ray.add_argument("--gpus-per-replica", type=float, default=None, help="default: 1 where CUDA is available, else 0")
    ray.add_argument("--ray-address", default=None,
                     help="a running Ray cluster to join ('auto' on a cluster node); default: start one here")
    # Advertise each flag's variable in --help.
    for command in (serve, serve_ray):
        for action in command._actions:
            if action.dest not in ("help",) and action.option_strings:
                action.help = f"{action.help} [env: {env_name(action.dest)}]"
    return parser


def _positive_int(raw: str) -> int:
    value = int(raw)
    if value < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return value


def _empty_is_value() -> set[str]:
    """Flags whose variable set to "" is a value to check (an empty API key), not "unset"."""
    engine_config, server_settings, localns = _flag_classes()
    fields = flag_fields(engine_config) + flag_fields(server_settings, localns)
    return {f.name for f, _ in fields if f.metadata.get("empty_is_value")}


def _apply_env_defaults(sub: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    """Turn ``SPECDEC_<FLAG>`` variables into defaults, validated like the flag itself. A variable
    set to "" counts as unset (as compose files write them), except where "" is a value to refuse."""
    keep_empty = _empty_is_value()
    for action in sub._actions:
        if not action.option_strings or action.dest == "help":
            continue
        name = env_name(action.dest)
        raw = env.get(name)
        if raw is None or (raw == "" and action.dest not in keep_empty):
            continue
        try:
            if isinstance(action, argparse.BooleanOptionalAction):
                value: Any = parse_env_bool(raw)
            else:
                value = action.type(raw) if callable(action.type) else raw
        except (argparse.ArgumentTypeError, ValueError) as exc:
            sub.error(f"environment variable {name}: invalid value {raw!r} ({exc})")
        if action.choices is not None and value not in action.choices:
            sub.error(f"environment variable {name}: {raw!r} is not one of {', '.join(map(str, action.choices))}")
        sub.set_defaults(**{action.dest: value})


def parse_serve_args(argv: Sequence[str], env: Mapping[str, str] | None = None) -> argparse.Namespace:
    """Parse ``serve`` / ``serve-ray`` arguments with environment defaults (exits with usage errors
    like argparse)."""
    parser = build_parser()
    env = os.environ if env is None else env
    for name in ("serve", "serve-ray"):
        _apply_env_defaults(_subparser(parser, name), env)
    args = parser.parse_args(list(argv))
    if args.command not in ("serve", "serve-ray"):
        parser.print_help(sys.stderr)
        parser.exit(2)
    return args


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[name]
    raise AssertionError(f"{name} subcommand missing")


def settings_from_args(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> ServerSettings:
    """Build settings from the flags that were given; the others keep the dataclasses' defaults."""
    engine_config, server_settings, localns = _flag_classes()
    env = os.environ if env is None else env
    engine_kwargs = given_values(args, [f.name for f, _ in flag_fields(engine_config)])
    try:
        engine = engine_config(**engine_kwargs)
    except ValueError as exc:
        raise SystemExit(f"specdec serve: error: {exc}") from None
    grace_raw = env.get(GRACE_ENV)
    try:
        grace = float(grace_raw) if grace_raw else 30.0
        if grace < 0:
            raise ValueError
    except ValueError:
        raise SystemExit(f"specdec serve: error: {GRACE_ENV} must be seconds >= 0, got {grace_raw!r}") from None
    server_kwargs = given_values(args, [f.name for f, _ in flag_fields(server_settings, localns)])
    try:
        return server_settings(engine=engine, shutdown_grace_s=grace, **server_kwargs)
    except ValueError as exc:
        raise SystemExit(f"specdec serve: error: {exc}") from None


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point (``specdec``). Returns the process exit status."""
    args = parse_serve_args(sys.argv[1:] if argv is None else argv)
    settings = settings_from_args(args)
    from server.app import MODEL_FILE_EXIT
    from specdec_core.engine.model_files import ModelFileError, check_model_files

    try:  # before the port opens: a malformed file is one line and this exit status, never a 503 meanwhile
        check_model_files(settings.engine)
    except ModelFileError as exc:
        print(f"specdec {args.command}: error: {exc}", file=sys.stderr)
        return MODEL_FILE_EXIT
    if args.command == "serve-ray":
        try:
            import ray  # noqa: F401 - only to say clearly what is missing

            from server.ray_serve import RayScaling, serve_ray
        except ImportError:
            raise SystemExit("specdec serve-ray: error: Ray Serve is not installed; pip install 'specdec[ray]'") from None
        if args.min_replicas > args.max_replicas:
            raise SystemExit("specdec serve-ray: error: --min-replicas is more than --max-replicas")
        scaling = RayScaling(args.num_replicas, args.min_replicas, args.max_replicas, args.target_ongoing_requests,
                             args.cpus_per_replica, args.gpus_per_replica, args.ray_address)
        return serve_ray(settings, scaling)
    from server.runner import serve

    return serve(settings)
