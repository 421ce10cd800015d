"""``GET /openapi.json``: the API's OpenAPI document (built in server.routes.openapi_document)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from server.http.jsonio import JSONResponse
from server.routes.openapi_document import openapi_document


async def openapi_json(request: Request) -> Response:
    return JSONResponse(openapi_document())
