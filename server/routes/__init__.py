"""The HTTP routes, one module per endpoint family."""

from __future__ import annotations

from starlette.routing import Route

from server.routes.chat import create_chat_completion
from server.routes.chat_page import chat_page
from server.routes.completions import create_completion
from server.routes.health import health
from server.routes.messages import count_tokens, create_message
from server.routes.metrics import metrics
from server.routes.models import list_models, retrieve_model
from server.routes.openapi import openapi_json
from server.routes.responses import (
    compact_response,
    count_input_tokens,
    create_response,
    delete_response,
    list_input_items,
    retrieve_response,
)


def routes() -> list[Route]:
    return [
        Route("/v1/completions", create_completion, methods=["POST"]),
        Route("/v1/chat/completions", create_chat_completion, methods=["POST"]),
        Route("/v1/responses", create_response, methods=["POST"]),
        Route("/v1/responses/input_tokens", count_input_tokens, methods=["POST"]),
        Route("/v1/responses/compact", compact_response, methods=["POST"]),
        Route("/v1/responses/{response_id}", retrieve_response, methods=["GET"]),
        Route("/v1/responses/{response_id}", delete_response, methods=["DELETE"]),
        Route("/v1/responses/{response_id}/input_items", list_input_items, methods=["GET"]),
        Route("/v1/messages", create_message, methods=["POST"]),
        Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", retrieve_model, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/openapi.json", openapi_json, methods=["GET"]),
        Route("/", chat_page, methods=["GET"]),
    ]
