"""``GET /v1/models`` and ``GET /v1/models/{model}``: the one model this server serves."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from server.http.jsonio import JSONResponse
from server.routes.common import check_model, server_state
from server.state import ServerState


def _model_card(state: ServerState) -> dict:
    return {"id": state.served_model_name, "object": "model", "created": state.created, "owned_by": "specdec"}


async def list_models(request: Request) -> Response:
    state = server_state(request)
    if state.engine is None:
        state.require_engine()  # raises the 503 that says why (loading / failed)
    return JSONResponse({"object": "list", "data": [_model_card(state)]})


async def retrieve_model(request: Request) -> Response:
    state = server_state(request)
    if state.engine is None:
        state.require_engine()  # raises the 503 that says why (loading / failed)
    check_model(state, request.path_params["model"])
    return JSONResponse(_model_card(state))
