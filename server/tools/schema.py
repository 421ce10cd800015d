"""The tool-calling fields of a chat request: ``tools``, ``tool_choice`` and past calls.

A function's ``parameters`` must be a JSON schema of an object (checked against its meta-schema,
cached by the schema's text), so a broken one is a 400 naming it, never a prompt the model cannot
follow or a grammar that fails later.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Annotated, Any, Literal

import jsonschema
from pydantic import AfterValidator, Field, PlainValidator, field_validator

from server.api.schema_base import Schema, invalid, schema_within_caps
from server.http.jsonio import MAX_JSON_DEPTH, loads_bounded, nesting_depth

FUNCTION_NAME = r"[A-Za-z0-9_.-]{1,64}"  # OpenAI's rule for a function's name
FunctionName = Annotated[str, Field(pattern=f"^{FUNCTION_NAME}$")]


MAX_CACHED_SCHEMA_BYTES = 64 * 1024  # the meta-schema cache holds at most 256 x 64 KiB


def _parameters_schema(value: dict[str, Any] | None) -> dict[str, Any] | None:
    """A function's ``parameters`` must be a JSON schema (checked against its draft's meta-schema,
    2020-12 unless ``$schema`` says otherwise) of an object, as OpenAI requires: a bad one is a 400
    naming it rather than a prompt the model cannot follow or a grammar that fails later."""
    if value is None:
        return value
    if nesting_depth(value) > MAX_JSON_DEPTH:
        raise invalid("nests deeper than {limit} levels.", limit=MAX_JSON_DEPTH)
    schema_within_caps(value)  # OpenAI's caps, as on response_format, before the meta-schema check
    text = json.dumps(value, sort_keys=True)  # not orjson: a body may hold integers beyond 64 bits
    check = _meta_schema_problem if len(text) <= MAX_CACHED_SCHEMA_BYTES else _meta_schema_problem.__wrapped__
    problem = check(text)
    if problem is not None:
        raise invalid("is not a valid JSON schema: {reason}", reason=problem)
    if value.get("type", "object") != "object":
        raise invalid('must be the JSON schema of an object ("type": "object").')
    return value


@functools.lru_cache(maxsize=256)
def _meta_schema_problem(schema_json: str) -> str | None:
    """Why a schema fails its meta-schema, or None. Cached by the schema's text: checking one
    against the 2020-12 meta-schema takes ~5 ms, and a chat app sends the same tools every turn."""
    schema = json.loads(schema_json)
    validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        validator.check_schema(schema)
    except jsonschema.SchemaError as err:
        return err.message
    return None


# A function's arguments schema, wherever an API declares one (chat's ``parameters``, the
# Responses API's ``parameters``, Anthropic's ``input_schema``): one check for all of them.
FunctionParameters = Annotated[dict[str, Any] | None, AfterValidator(_parameters_schema)]


class FunctionDefinition(Schema):
    """A tool the model may call: its name, what it does, and a JSON schema of its arguments."""

    name: FunctionName
    description: str | None = None
    parameters: FunctionParameters = None
    strict: bool | None = None  # accepted; calls forced by tool_choice always match the schema


class Tool(Schema):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(Schema):
    name: FunctionName


class NamedToolChoice(Schema):
    """``{"type": "function", "function": {"name": ...}}``: call exactly this tool."""

    type: Literal["function"]
    function: NamedFunction


TOOL_CHOICE_FORMS = 'must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}.'
ToolMode = Literal["none", "auto", "required"]


def _tool_choice(value: Any) -> str | NamedToolChoice:
    """One of the modes or a named function; a bad value is reported against ``tool_choice``
    itself (a pydantic union would name its members in the error's location)."""
    if isinstance(value, str) and value in ("none", "auto", "required"):
        return value
    function = value.get("function") if isinstance(value, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if value.get("type") != "function" if isinstance(value, dict) else True:
        raise invalid(TOOL_CHOICE_FORMS)
    if not isinstance(name, str) or not re.fullmatch(FUNCTION_NAME, name):
        raise invalid(TOOL_CHOICE_FORMS)
    return NamedToolChoice(type="function", function=NamedFunction(name=name))


ToolChoice = Annotated[ToolMode | NamedToolChoice, PlainValidator(_tool_choice, json_schema_input_type=ToolMode | NamedToolChoice)]


class FunctionCall(Schema):
    name: FunctionName
    arguments: str  # a JSON object, as text (OpenAI's format)

    @field_validator("arguments")
    @classmethod
    def _json_object(cls, value: str) -> str:
        try:
            parsed = loads_bounded(value)
        except ValueError as exc:
            raise invalid("must be a JSON object written as a string ({reason}).", reason=str(exc)[:200]) from None
        if not isinstance(parsed, dict):
            raise invalid("must be a JSON object written as a string.")
        return value


class AssistantToolCall(Schema):
    """A call the assistant made earlier in the conversation."""

    id: str
    type: Literal["function"]
    function: FunctionCall
