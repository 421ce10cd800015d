"""JSON in and out through orjson (fast, and strict: NaN/Infinity are not valid request JSON)."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response


def dumps(obj: Any) -> bytes:
    return orjson.dumps(obj)


def dumps_str(obj: Any) -> str:
    return orjson.dumps(obj).decode()


def loads(data: bytes | str) -> Any:
    """Parse JSON; raises ``orjson.JSONDecodeError`` (a ``ValueError``) on malformed input."""
    return orjson.loads(data)


class JSONResponse(Response):
    """A Starlette response rendered with orjson."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)
