"""JSON responses through orjson (fast). Request bodies are parsed by pydantic (server.openai.parsing)."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response


def dumps(obj: Any) -> bytes:
    return orjson.dumps(obj)


def dumps_str(obj: Any) -> str:
    return orjson.dumps(obj).decode()


class JSONResponse(Response):
    """A Starlette response rendered with orjson."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)
