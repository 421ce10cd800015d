"""``GET /v1/models`` and ``GET /v1/models/{model}``: the one model this server serves.

The list is OpenAI's (``object``, ``data``) with the context length as vLLM gives it
(``max_model_len``), and also carries the model as Codex CLI reads a provider's ``/models``
(``models``: ``slug``, ``context_window`` and the fields its ``ModelInfo`` requires), so Codex
learns the context window it compacts against when it asks (with command auth; with ``env_key``
it reads its own catalog, see docs/using-with-clients.md).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from server.http.jsonio import JSONResponse
from server.routes.common import check_model, server_state
from server.state import ServerState


def _model_card(state: ServerState) -> dict:
    return {"id": state.served_model_name, "object": "model", "created": state.created, "owned_by": "specdec",
            "max_model_len": state.require_engine().max_model_len}


def codex_model_info(state: ServerState) -> dict:
    """The model as Codex's ``ModelInfo`` (its required fields, and the context window)."""
    name = state.served_model_name
    return {"slug": name, "display_name": name, "description": f"{name} served by specdec",
            "supported_reasoning_levels": [], "shell_type": "default", "visibility": "list", "supported_in_api": True,
            "priority": 0, "support_verbosity": False, "truncation_policy": {"mode": "tokens", "limit": 10_000},
            "experimental_supported_tools": [], "input_modalities": ["text"],
            "context_window": state.require_engine().max_model_len}


async def list_models(request: Request) -> Response:
    state = server_state(request)
    if state.engine is None:
        state.require_engine()  # raises the 503 that says why (loading / failed)
    return JSONResponse({"object": "list", "data": [_model_card(state)], "models": [codex_model_info(state)]})


async def retrieve_model(request: Request) -> Response:
    state = server_state(request)
    if state.engine is None:
        state.require_engine()  # raises the 503 that says why (loading / failed)
    check_model(state, request.path_params["model"])
    return JSONResponse(_model_card(state))
