"""Typed readers for JSON request fields; each failure is a 400 that names the field (``param``).

JSON ``null`` means "not given" everywhere (many clients send every field, nulls included). Python
quirks are closed off: ``true`` is not an integer, ``1.5`` is not an integer, and floats must be
finite.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from server.errors import invalid_request


def type_name(value: Any) -> str:
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


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def get_int(
    body: Mapping[str, Any], name: str, default: int | None, *, minimum: int | None = None, maximum: int | None = None
) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if not is_int(value):
        raise invalid_request(f"'{name}' must be an integer, got {type_name(value)} {value!r}.", name)
    _check_range(name, value, minimum, maximum)
    return value


def get_float(
    body: Mapping[str, Any],
    name: str,
    default: float,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    exclusive_minimum: bool = False,
) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise invalid_request(f"'{name}' must be a number, got {type_name(value)} {value!r}.", name)
    if exclusive_minimum and minimum is not None and value <= minimum:
        upper = f", {maximum}]" if maximum is not None else ", inf)"
        raise invalid_request(f"'{name}' must be in ({minimum}{upper}, got {value}.", name)
    _check_range(name, value, None if exclusive_minimum else minimum, maximum)
    return float(value)


def get_bool(body: Mapping[str, Any], name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid_request(f"'{name}' must be a boolean, got {type_name(value)} {value!r}.", name)
    return value


def get_str(body: Mapping[str, Any], name: str, default: str | None = None) -> str | None:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, str):
        raise invalid_request(f"'{name}' must be a string, got {type_name(value)}.", name)
    return value


def get_object(body: Mapping[str, Any], name: str) -> dict | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise invalid_request(f"'{name}' must be an object, got {type_name(value)}.", name)
    return value


def get_stop(body: Mapping[str, Any], name: str = "stop") -> list[str]:
    """``stop``: a string or a list of strings (each non-empty)."""
    value = body.get(name)
    if value is None:
        return []
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise invalid_request(f"'{name}' must be a string or an array of strings.", name)
    if any(s == "" for s in items):
        raise invalid_request(f"'{name}' strings must not be empty.", name)
    return list(items)


def get_int_list(body: Mapping[str, Any], name: str, *, minimum: int = 0) -> list[int]:
    value = body.get(name)
    if value is None:
        return []
    if not isinstance(value, list) or not all(is_int(v) and v >= minimum for v in value):
        raise invalid_request(f"'{name}' must be an array of integers >= {minimum}.", name)
    return list(value)


def _check_range(name: str, value: float, minimum: float | None, maximum: float | None) -> None:
    if minimum is not None and maximum is not None and not minimum <= value <= maximum:
        raise invalid_request(f"'{name}' must be in [{minimum}, {maximum}], got {value}.", name)
    if minimum is not None and value < minimum:
        raise invalid_request(f"'{name}' must be >= {minimum}, got {value}.", name)
    if maximum is not None and value > maximum:
        raise invalid_request(f"'{name}' must be <= {maximum}, got {value}.", name)
