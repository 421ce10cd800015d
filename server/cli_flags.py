"""Command-line flags generated from dataclass fields (``EngineConfig``, ``ServerSettings``).

A field whose ``metadata`` has a ``help`` text becomes ``--field-name`` (environment variable
``SPECDEC_FIELD_NAME``): its type gives the parser (``int``, ``float``, ``str``, ``Path``), a ``Literal``
gives the choices, a ``bool`` gives ``--x/--no-x``, and ``minimum``/``maximum`` bounds are checked
while parsing so a bad value fails naming the flag or variable. Flags default to ``None`` ("not
given"), and only given values reach the dataclass, so its own defaults stay the single source.
Adding a field with metadata adds the flag, its variable and its --help line; nothing here changes.

The parser must not import torch (``specdec serve --help`` stays instant): ``specdec_core``
imports its engine lazily, so ``specdec_core.engine.config`` alone is cheap.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any


def engine_config_class() -> type:
    """``specdec_core.engine.config.EngineConfig``; the package imports lazily, so this stays torch-free."""
    from specdec_core.engine.config import EngineConfig

    return EngineConfig


def flag_fields(cls: type, localns: Mapping[str, Any] | None = None) -> list[tuple[dataclasses.Field, Any]]:
    """The fields of dataclass ``cls`` that are flags, with their resolved type hints."""
    hints = typing.get_type_hints(cls, localns=dict(localns or {}))
    return [(f, hints[f.name]) for f in dataclasses.fields(cls) if "help" in f.metadata]


def flag_name(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _strip_optional(hint: Any) -> Any:
    """``X | None`` -> ``X`` (``None`` is how a flag says "not given", never a value to type)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return hint


def _bounded(kind: type, minimum: float | None, maximum: float | None) -> Callable[[str], Any]:
    """A parser of ``kind`` (int or float) that checks the bounds."""
    noun = "integer" if kind is int else "number"

    def parse(text: str) -> Any:
        value = kind(text)
        if minimum is not None and maximum is not None and not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(f"must be in [{minimum}, {maximum}], got {value}")
        if minimum is not None and value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"must be <= {maximum}, got {value}")
        return value

    # argparse names the type in "invalid <name> value" errors.
    if minimum is not None and maximum is not None:
        parse.__name__ = f"{noun} in [{minimum}, {maximum}]"
    elif minimum is not None:
        parse.__name__ = f"{noun} >= {minimum}"
    else:
        parse.__name__ = noun
    return parse


def _one_of(choices: tuple[str, ...]) -> Callable[[str], str]:
    """Case-insensitive choice ("DEBUG" is a fine log level)."""

    def parse(text: str) -> str:
        value = text.lower()
        if value not in choices:
            raise argparse.ArgumentTypeError(f"must be one of {', '.join(choices)}, got {text!r}")
        return value

    parse.__name__ = "choice"
    return parse


def _default_text(f: dataclasses.Field) -> str | None:
    if "default_help" in f.metadata:
        return f.metadata["default_help"]
    if f.default is dataclasses.MISSING or f.default is None:
        return None
    if isinstance(f.default, bool):
        return flag_name(f.name) if f.default else "--no-" + flag_name(f.name)[2:]
    return str(f.default)


def add_flags(groups: Callable[[str], Any], cls: type, localns: Mapping[str, Any] | None = None) -> list[str]:
    """Add a flag per flag field of ``cls`` to the argument group ``groups(metadata group)``.

    Returns the fields' names (the ``argparse`` dests), which ``given_values`` reads back.
    """
    dests = []
    for f, hint in flag_fields(cls, localns):
        meta = f.metadata
        hint = _strip_optional(hint)
        kwargs: dict[str, Any] = {"default": None, "dest": f.name}
        if hint is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif typing.get_origin(hint) is typing.Literal:
            choices = tuple(typing.get_args(hint))
            if meta.get("ignore_case"):
                kwargs["type"] = _one_of(choices)
                kwargs["metavar"] = "{" + ",".join(choices) + "}"
            else:
                kwargs["choices"] = choices
        elif hint in (int, float):
            kwargs["type"] = _bounded(hint, meta.get("minimum"), meta.get("maximum"))
        elif hint is Path:
            kwargs["type"] = Path
            kwargs["metavar"] = "DIR"
        elif hint is not str:
            raise TypeError(f"{cls.__name__}.{f.name}: no command-line form for {hint!r}")
        default = _default_text(f)
        kwargs["help"] = meta["help"] + (f" (default: {default})" if default is not None else "")
        groups(meta.get("group", "options")).add_argument(flag_name(f.name), **kwargs)
        dests.append(f.name)
    return dests


def given_values(args: argparse.Namespace, dests: list[str]) -> dict[str, Any]:
    """The flags that were given (on the command line or by environment), by field name."""
    return {name: getattr(args, name) for name in dests if getattr(args, name, None) is not None}


def parse_env_bool(text: str) -> bool:
    """An environment value for a ``--x/--no-x`` flag."""
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected one of 1/0, true/false, yes/no, on/off")
