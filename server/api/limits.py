"""Per-request limits: how much work one request may ask for, and the 400 that says how to raise it.

The limits are ``ServerSettings`` fields, so each is a flag (``--max-stop-strings``, ...). The
request schemas enforce them while they validate a body: ``server.api.parsing.parse_body`` hands the
settings to pydantic as its validation context, and the validators in ``server.openai.schemas`` call the
checks below. So an over-limit request is refused before its prompts are tokenized, before its
stop strings are compiled, and before a long array is validated item by item (counts are checked
first). A schema validated without settings (its unit tests, the OpenAPI document) is unlimited.

The error names the field (``param``), says what was asked and what is allowed, and names the flag
and variable that raise the limit; its ``code`` is ``limit_exceeded``.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from pydantic import ValidationInfo
from pydantic_core import PydanticCustomError

if TYPE_CHECKING:
    from server.settings import ServerSettings

LIMIT_EXCEEDED = "limit_exceeded"


def settings_of(info: ValidationInfo) -> ServerSettings | None:
    """The server settings a body is validated under, if any (see the module docstring)."""
    context = info.context
    return context.get("settings") if isinstance(context, dict) else None


def exceeded(setting: str, asked: str, limit: int) -> PydanticCustomError:
    """The error for a request over the limit ``setting`` (a ``ServerSettings`` field name);
    ``asked`` completes "'<param>' ..." with what the request asked for."""
    return PydanticCustomError(
        LIMIT_EXCEEDED,
        "{asked}; this server accepts at most {limit} (raise it with {flag} or {env}).",
        {"asked": asked, "limit": limit, "flag": "--" + setting.replace("_", "-"), "env": "SPECDEC_" + setting.upper()},
    )


def check_count(count: int, limit: int, setting: str, noun: str) -> None:
    if count > limit:
        raise exceeded(setting, f"has {count} {noun}", limit)


def check_stop_strings(stops: list[str], settings: ServerSettings) -> None:
    check_count(len(stops), settings.max_stop_strings, "max_stop_strings", "strings")
    check_count(sum(map(len, stops)), settings.max_stop_chars, "max_stop_chars", "characters in all")


def check_sequences(prompts: int, n: int, settings: ServerSettings) -> None:
    """Every prompt runs ``n`` times: a request is that many engine sequences."""
    limit = settings.max_sequences_per_request
    if prompts * n > limit:
        if prompts == 1:
            asked = f"asks for {n} sequences"
        else:
            asked = f"has {prompts} prompts, with 'n' = {n} that is {prompts * n} sequences"
        raise exceeded("max_sequences_per_request", asked, limit)


def check_prompt_chars(chars: int, settings: ServerSettings, what: str = "") -> None:
    """``what`` says what was counted when it is more than the field itself ("messages and tools together")."""
    noun = "characters of prompt text" + (f" ({what})" if what else "")
    check_count(chars, settings.prompt_chars_limit, "max_prompt_chars", noun)


def json_chars(value: Any) -> int:
    """Characters of ``value`` as compact JSON (escapes aside): how tool definitions reach the
    prompt. Iterative, so it needs no bound on nesting, and it builds no string."""
    total, todo = 0, [value]
    while todo:
        item = todo.pop()
        if isinstance(item, dict):
            total += 1 + max(len(item), 1) + sum(len(str(key)) + 3 for key in item)  # {} , "key":
            todo.extend(item.values())
        elif isinstance(item, list):
            total += 1 + max(len(item), 1)  # [] and commas
            todo.extend(item)
        elif isinstance(item, str):
            total += len(item) + 2
        else:
            total += len(json.dumps(item))
    return total


def check_list_size(value: Any, info: ValidationInfo, setting: str, noun: str) -> Any:
    """A list field counted against ``setting`` before its items are validated (a million
    messages must not be validated one by one before the count refuses them)."""
    settings = settings_of(info)
    if settings is not None and isinstance(value, list):
        check_count(len(value), getattr(settings, setting), setting, noun)
    return value
