"""JSON responses through orjson (fast); JSON text inside a body or the model's output parsed with a
depth bound. Request bodies themselves are parsed by pydantic (server.api.parsing)."""

from __future__ import annotations

import json
from typing import Any

import orjson
from starlette.responses import Response

# Nesting allowed in JSON a client or the model writes inside a field (tool-call arguments, a
# function's parameters): far beyond any real call, far below what recursion can handle.
MAX_JSON_DEPTH = 64
# Digits an integer in such JSON may have: Python's own bound on decimal conversion (which is
# quadratic in the digits), said in the 400 instead of Python's advice to raise it.
MAX_INT_DIGITS = 4300


def _bounded_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"an integer has more than {MAX_INT_DIGITS} digits")
    return int(digits)


def ascii_int(text: str | None, max_digits: int = 19) -> int | None:
    """``text`` as a non-negative integer when it is 1 to ``max_digits`` ASCII digits, else None.
    ``str.isdigit`` alone also takes ``"²"`` and ``"٣"`` (which ``int`` then refuses or reads) and
    any number of digits: query values and headers come from clients."""
    if text is None or not 0 < len(text) <= max_digits or not (text.isascii() and text.isdigit()):
        return None
    return int(text)


def nesting_depth(value: Any) -> int:
    """How deeply objects and arrays nest in ``value``, counted without recursion (a body may nest
    a thousand levels; checks and templates that walk it recurse several frames per level)."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth)
            todo.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def loads_bounded(text: str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """JSON text from a client or the model, parsed; ``ValueError`` when it is not JSON or nests
    deeper than ``max_depth``. Deep text used to escape as ``RecursionError`` (a 500, or an
    ``internal_error`` stream event), from the parser or from whatever walked the value next.
    The stdlib parser, not orjson: a value may hold integers beyond 64 bits (up to
    ``MAX_INT_DIGITS`` digits)."""
    try:
        value = json.loads(text, parse_int=_bounded_int)
    except RecursionError:
        raise ValueError(f"nests deeper than {max_depth} levels") from None
    if nesting_depth(value) > max_depth:
        raise ValueError(f"nests deeper than {max_depth} levels")
    return value


def dumps(obj: Any) -> bytes:
    return orjson.dumps(obj)


def dumps_str(obj: Any) -> str:
    return orjson.dumps(obj).decode()


class JSONResponse(Response):
    """A Starlette response rendered with orjson."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)
