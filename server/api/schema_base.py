"""What every request schema shares: strict types, null as "not given", named refusals.

Each field's type and bounds are declared once, here; validation, the 400 a client gets (see
``server.api.parsing``) and the served OpenAPI document (``server.routes.openapi_document``) all come from these
declarations. Types are strict where OpenAI's are (``max_tokens`` is an integer, not ``"5"``,
``5.5`` or ``true``) and floats must be finite. JSON ``null`` means "not given" everywhere (many
clients send every field, nulls included).

Fields this server does not know are ignored (``extra="allow"``; the route logs their names), as
OpenAI and vLLM do, so a client written for a newer API still works. Known OpenAI fields whose
feature is not implemented (``suffix``, ``best_of`` other than ``n``, non-text content, the
deprecated ``functions``) are refused by name instead: ignoring them would silently change what
the client gets.

Extensions (documented in ``specdec serve --help``): ``top_k`` (0 or -1 = off),
``num_speculative_tokens`` (int >= 0: caps k for this request, 0 = no speculation),
``speculative`` (``false`` = no speculation), ``ignore_eos``, ``stop_token_ids``, ``min_tokens``,
``cache_salt`` (vLLM's: prefix-cache isolation), and ``response_format`` on completions too.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

MAX_N = 128
MAX_LOGIT_BIAS = 1024
MAX_COMPLETION_LOGPROBS = 5
MAX_CHAT_TOP_LOGPROBS = 20
MAX_TOOLS = 128  # OpenAI's cap on the tools of one request
# Integers are int64 (as in OpenAI's API): a bound on every integer field keeps absurd values
# (JSON integers are unbounded) a clear range error instead of arithmetic on 4000-digit numbers.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
SEED_MIN, SEED_MAX = INT64_MIN, INT64_MAX
LEGACY_FUNCTIONS = "The deprecated 'functions' and 'function_call' are not supported; use 'tools' and 'tool_choice'."
T = TypeVar("T")

# specdec's (and vLLM's) extensions every generating API takes, declared once (`specdec serve --help`).
Seed = Annotated[int | None, Field(ge=SEED_MIN, le=SEED_MAX)]
TopK = Annotated[int, Field(ge=-1, le=INT64_MAX, description="Sample from the k most likely tokens; 0 or -1: off.")]
SpeculativeSwitch = Annotated[bool, Field(description="false: no speculation for this request.")]
NumSpeculativeTokens = Annotated[
    int | None, Field(ge=0, le=INT64_MAX, description="Caps the draft length k for this request; 0: no speculation.")]
CacheSalt = Annotated[str | None, Field(
    min_length=1, max_length=1024,
    description="vLLM's: the prompt shares prefix-cache blocks only with requests that send the same salt, so "
                "one tenant's time to first token does not reveal another's prompts (use a long random secret).")]


def require_distinct(names: list[str], noun: str = "function") -> None:
    """The tools of one request name each function once (every API refuses a repeat)."""
    if len(set(names)) != len(names):
        raise invalid(f"names a {noun} twice.")


def invalid(message: str, **context: Any) -> PydanticCustomError:
    """A validation error whose message completes "'<param>' ..." (see ``server.api.parsing``).
    Values from the request go in ``context``, never into the template itself."""
    return PydanticCustomError("invalid_value", message, context)


def unsupported(detail: str, **context: Any) -> PydanticCustomError:
    """A known OpenAI feature this server does not implement: a 400 with code ``unsupported_parameter``."""
    return PydanticCustomError("unsupported_parameter", detail, context)


def _nullable_optionals(schema: dict[str, Any]) -> None:
    """Say in the JSON schema what ``_null_means_absent`` does: every optional field accepts null."""
    required = set(schema.get("required", ()))
    for name, prop in schema.get("properties", {}).items():
        if name in required or prop.get("type") == "null" or {"type": "null"} in prop.get("anyOf", ()):
            continue
        meta = {key: prop.pop(key) for key in ("title", "default", "description") if key in prop}
        schema["properties"][name] = {"anyOf": [prop, {"type": "null"}], **meta}


class Schema(BaseModel):
    """Common configuration: strict types, finite floats, unknown fields kept aside (see module doc)."""

    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False, json_schema_extra=_nullable_optionals)

    @model_validator(mode="before")
    @classmethod
    def _null_means_absent(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {key: value for key, value in data.items() if value is not None}
        return data

    def unknown_fields(self, prefix: str = "") -> list[str]:
        """Paths (``messages[0].foo``) of every field this model and its parts ignored."""
        found = [f"{prefix}{name}" for name in self.model_extra or {}]
        for name in type(self).model_fields:
            value = getattr(self, name)
            items = enumerate(value) if isinstance(value, list) else [(None, value)]
            for i, item in items:
                if isinstance(item, Schema):
                    found += item.unknown_fields(f"{prefix}{name}" + ("" if i is None else f"[{i}]") + ".")
        return found


def only_off(detail: str, *off: Any) -> BeforeValidator:
    """For a feature this server lacks: accept only the values that leave it off (null is always
    accepted: it means "not given"), refuse anything else by name before any type check. The
    field's type is declared as narrowly, so the JSON schema tells clients the same."""

    def check(value: Any) -> Any:
        if not any(type(value) is type(ok) and value == ok for ok in off):
            raise unsupported(detail)
        return value

    return BeforeValidator(check)


def text_as_parts(part_type: str, noun: str) -> Callable[[Any], Any]:
    """The before-validator of a content field that also takes a bare string, as chat's, the
    Responses API's and the Messages API's all do: the string is one text part of ``part_type``;
    anything but a string or an array is refused, naming ``noun``."""

    def parts(value: Any) -> Any:
        if isinstance(value, str):
            return [{"type": part_type, "text": value}]
        if not isinstance(value, list):
            raise invalid("must be a string or an array of {noun}.", noun=noun)
        return value

    return parts


def fields_fit_the_type(model: BaseModel, kind: str, noun: str, need: tuple[str, ...], fields: tuple[str, ...],
                        also: tuple[str, ...] = ()) -> None:
    """For a part whose type ``kind`` decides its fields (a Responses input item, a Messages content
    block), declared with every type's fields optional: refuse one that lacks a field of ``need``,
    or carries one of ``fields`` that its type has not (``also``: the ones it may carry anyway)."""
    missing = [name for name in need if getattr(model, name) is None]
    if missing:
        raise invalid("is a {kind} {noun} without {missing}.", kind=kind, noun=noun,
                      missing=", ".join(f"'{m}'" for m in missing))
    extra = sorted(name for name in fields if name not in need + also and getattr(model, name) is not None)
    if extra:
        raise invalid("is a {kind} {noun}, which has no {extra}.", kind=kind, noun=noun,
                      extra=", ".join(f"'{e}'" for e in extra))


NoFunctions = Annotated[list[dict[str, Any]], Field(max_length=0), only_off(LEGACY_FUNCTIONS, [])]
NoFunctionCall = Annotated[None, only_off(LEGACY_FUNCTIONS)]

NonEmptyStr = Annotated[str, Field(min_length=1)]
TokenId = Annotated[int, Field(ge=0, le=INT64_MAX)]
NonEmptyList = Annotated[list[T], Field(min_length=1)]
TokenIds = NonEmptyList[TokenId]


# OpenAI's caps on a structured-output schema: a schema past them is a 400 before any compile.
MAX_SCHEMA_PROPERTIES, MAX_SCHEMA_ENUM_VALUES, MAX_SCHEMA_CHARS = 5_000, 1_000, 120_000


def schema_within_caps(schema: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's caps, on ``response_format`` schemas and on each tool's ``parameters`` alike. Counted
    without recursion (a schema may nest deeply); a 7 MB schema with 100k ``$defs`` stalled the
    server for over a minute while it compiled."""
    if len(json.dumps(schema, ensure_ascii=False)) > MAX_SCHEMA_CHARS:
        raise invalid("is longer than {limit} characters.", limit=MAX_SCHEMA_CHARS)
    properties = enums = 0
    todo: list[Any] = [schema]
    while todo:
        item = todo.pop()
        if isinstance(item, dict):
            if isinstance(item.get("properties"), dict):
                properties += len(item["properties"])
            if isinstance(item.get("enum"), list):
                enums += len(item["enum"])
            todo.extend(item.values())
        elif isinstance(item, list):
            todo.extend(item)
    if properties > MAX_SCHEMA_PROPERTIES:
        raise invalid("has {count} properties; at most {limit} are allowed.", count=properties, limit=MAX_SCHEMA_PROPERTIES)
    if enums > MAX_SCHEMA_ENUM_VALUES:
        raise invalid("has {count} enum values; at most {limit} are allowed.", count=enums, limit=MAX_SCHEMA_ENUM_VALUES)
    return schema
