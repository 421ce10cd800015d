"""Request body bytes -> a validated ``server.openai.schemas`` model, or a 400 OpenAI error object.

pydantic parses the raw bytes itself (``model_validate_json``): its parser keeps integers exact,
so ``2**64`` is reported as out of range rather than as a float that is "not an integer". Of its
errors the first is reported, as OpenAI does: ``param`` is the error's location
(``messages[0].content``), and the message is written for a human from the error's type and
context, never parsed out of pydantic's text.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from server.api.limits import LIMIT_EXCEEDED
from server.http.errors import APIError, invalid_request, unsupported

if TYPE_CHECKING:
    from server.settings import ServerSettings

M = TypeVar("M", bound=BaseModel)

# pydantic error type -> what the field must be (the value's JSON type follows).
_TYPE_ERRORS = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "bool_type": "a boolean",
    "bool_parsing": "a boolean",
    "string_type": "a string",
    "float_type": "a number",
    "float_parsing": "a number",
    "finite_number": "a finite number",
    "list_type": "an array",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
}
_BOUNDS = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}


def parse_body(model: type[M], raw: bytes, settings: ServerSettings | None = None) -> M:
    """Validate a request body under the server's per-request limits (``server.api.limits``; none
    without ``settings``); raises the 400 ``APIError`` for its first problem. The work grows with
    the body: call it off the event loop."""
    if not raw.strip():
        raise invalid_request("The request body is empty; send a JSON object.", code="invalid_json")
    try:
        return model.model_validate_json(raw, context=None if settings is None else {"settings": settings})
    except ValidationError as exc:
        raise to_api_error(exc.errors(include_url=False)[0]) from None


def param_of(loc: tuple[int | str, ...]) -> str | None:
    """A pydantic location as OpenAI names a parameter: ``('messages', 0, 'role')`` -> ``messages[0].role``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or None


# OpenAI's codes for a bound: (kind, the value is an integer) -> code.
_BOUND_CODES = {">=": "below_min_value", ">": "below_min_value", "<=": "above_max_value", "<": "above_max_value"}


def to_api_error(error: ErrorDetails) -> APIError:
    """One pydantic error as the 400 a client gets: the field it names, what was wrong with it, and
    OpenAI's code for that kind of problem (``missing_required_parameter``, ``invalid_type``,
    ``integer_below_min_value``, ``empty_array``, ... ``invalid_value`` otherwise), never null."""
    kind, ctx, value = error["type"], error.get("ctx") or {}, error.get("input")
    param = param_of(error["loc"])
    if kind == "json_invalid":
        return invalid_request(f"The request body is not valid JSON: {ctx.get('error', error['msg'])}.", code="invalid_json")
    if param is None:
        if kind in ("model_type", "model_attributes_type"):
            return invalid_request(f"The request body must be a JSON object, got {json_type(value)}.", code="invalid_type")
        return invalid_request(f"Invalid request body: {error['msg']}.")
    field = f"'{param}'"
    code = "invalid_value"
    if kind == "unsupported_parameter":
        return unsupported(param, error["msg"])
    if kind == LIMIT_EXCEEDED:
        return invalid_request(f"{field} {error['msg']}", param, code=LIMIT_EXCEEDED)
    if kind == "invalid_value":
        message = f"{field} {error['msg']}"
        code = ctx.get("openai_code", code)  # a validator's own check of a bound names it as pydantic's would
    elif kind == "missing":
        message, code = f"{field} is required.", "missing_required_parameter"
    elif kind == "float_type" and json_type(value) == "integer":  # too large for a float
        message = f"{field} is out of range, got {show(value)}."
    elif kind in _TYPE_ERRORS:
        message, code = f"{field} must be {_TYPE_ERRORS[kind]}, got {json_type(value)} {show(value)}.", "invalid_type"
    elif kind in _BOUNDS:
        op = _BOUNDS[kind]
        bound = ctx.get({">=": "ge", ">": "gt", "<=": "le", "<": "lt"}[op])
        message = f"{field} must be {op} {bound}, got {show(value)}."
        number = "integer" if isinstance(value, int) and not isinstance(value, bool) else "decimal"
        code = f"{number}_{_BOUND_CODES[op]}"
    elif kind == "literal_error":
        message = f"{field} must be one of {ctx.get('expected')}, got {show(value)}."
    elif kind in ("too_short", "string_too_short") and ctx.get("min_length") == 1:
        message = f"{field} must not be empty."
        code = "empty_array" if kind == "too_short" else "empty_string"
    elif kind in ("too_long", "string_too_long"):
        message = f"{field}: {error['msg']}."
        code = "array_above_max_length" if kind == "too_long" else "string_above_max_length"
    else:
        message = f"{field}: {error['msg']}."
    return invalid_request(message, param, code=code)


def json_type(value: Any) -> str:
    """The JSON name of a parsed JSON value's type ("array", not "list")."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def show(value: Any, limit: int = 60) -> str:
    """A value as JSON for a message, cut short: it comes from the client and may be large."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=True)
    except (TypeError, ValueError):  # e.g. an integer too long for str()
        return f"<{json_type(value)}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."
