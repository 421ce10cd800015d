"""``GET /openapi.json``: an OpenAPI 3.1 document whose request bodies are the schemas' JSON schemas.

Generated from ``server.openai.schemas`` (never written by hand) so it cannot drift from what the server
validates; client generators and schema fuzzers (see tests/server/test_server_schema_fuzz.py) read it.
Responses are described only as far as clients rely on them: the OpenAI error object (and on
``/v1/messages`` Anthropic's).
"""

from __future__ import annotations

from functools import cache
from typing import Any

from pydantic.json_schema import models_json_schema

from server import __version__
from server.anthropic.schemas import MessagesPrompt, MessagesRequest
from server.openai.schemas.chat import ChatCompletionRequest
from server.openai.schemas.completions import CompletionRequest
from server.openai.schemas.responses import ResponsesRequest

REF = "#/components/schemas/{model}"

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}


ANTHROPIC_ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["type", "error"],
    "properties": {
        "type": {"const": "error"},
        "error": {
            "type": "object",
            "required": ["type", "message"],
            "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
        },
    },
}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*statuses: int, anthropic: bool = False) -> dict[str, Any]:
    name, what = ("AnthropicError", "An Anthropic error object.") if anthropic else ("Error", "An OpenAI error object.")
    return {str(s): _json({"$ref": REF.format(model=name)}, what) for s in statuses}


def _generation(summary: str, model: type, answer: str, stream: str = "chunks ending in 'data: [DONE]'",
                anthropic: bool = False) -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "requestBody": {"required": True, "content": {"application/json": {"schema": {"$ref": REF.format(model=model.__name__)}}}},
            "responses": {
                "200": {
                    "description": f"{answer}; with \"stream\": true, a text/event-stream of {stream}.",
                    "content": {"application/json": {"schema": {"type": "object"}}, "text/event-stream": {"schema": {"type": "string"}}},
                },
                # 408/413/415: server.http.body
                **_errors(400, 401, 404, 408, 413, 415, 429, 500, 503, anthropic=anthropic),
            },
        }
    }


def _stored(method: str, summary: str, description: str) -> dict[str, Any]:
    ok = {"description": description, "content": {"application/json": {"schema": {"type": "object"}}}}
    return {method: {"summary": summary, "parameters": [RESPONSE_ID], "responses": {"200": ok, **_errors(400, 401, 404)}}}


RESPONSE_ID = {"name": "response_id", "in": "path", "required": True, "schema": {"type": "string"}}


def _get(summary: str, description: str, media: str = "application/json", statuses: tuple[int, ...] = ()) -> dict[str, Any]:
    ok = {"description": description, "content": {media: {"schema": {"type": "object" if media == "application/json" else "string"}}}}
    return {"get": {"summary": summary, "responses": {"200": ok, **_errors(*statuses)}}}


@cache
def openapi_document() -> dict[str, Any]:
    _, defs = models_json_schema(
        [(CompletionRequest, "validation"), (ChatCompletionRequest, "validation"), (ResponsesRequest, "validation"),
         (MessagesRequest, "validation"), (MessagesPrompt, "validation")], ref_template=REF
    )
    stored = {**_stored("get", "A stored response", "The response object."),
              **_stored("delete", "Delete a stored response", '{"id", "object": "response", "deleted": true}.')}
    items = _stored("get", "A stored response's input items", "A list of the request's input items (order, limit, after).")
    models = _get("The served model", "A list with the one model this server serves.", statuses=(401, 503))
    model = _get("One model", "The model card.", statuses=(401, 404, 503))
    model["get"]["parameters"] = [{"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}]
    return {
        "openapi": "3.1.0",
        "info": {"title": "specdec", "version": __version__, "description": "OpenAI-compatible API with speculative decoding."},
        "paths": {
            "/v1/completions": _generation("Create a completion", CompletionRequest, "A text_completion object"),
            "/v1/chat/completions": _generation("Create a chat completion", ChatCompletionRequest, "A chat.completion object"),
            "/v1/responses": _generation("Create a response (OpenAI Responses API)", ResponsesRequest, "A response object",
                                         "named events (response.created ... response.completed)"),
            "/v1/responses/{response_id}": stored,
            "/v1/responses/{response_id}/input_items": items,
            "/v1/messages": _generation("Create a message (Anthropic Messages API)", MessagesRequest, "A message object",
                                        "named events (message_start ... message_stop)", anthropic=True),
            "/v1/messages/count_tokens": {"post": {
                "summary": "Count a message's input tokens (Anthropic Messages API)",
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": {"$ref": REF.format(model="MessagesPrompt")}}}},
                "responses": {"200": _json({"type": "object", "properties": {"input_tokens": {"type": "integer"}}},
                                           '{"input_tokens": N}'),
                              **_errors(400, 401, 404, 413, 415, 503, anthropic=True)}}},
            "/v1/models": models,
            "/v1/models/{model}": model,
            "/health": _get("Liveness", "The engine loop runs ({\"status\": \"ok\"}); 503 while loading, draining or dead."),
            "/metrics": _get("Prometheus metrics", "Prometheus text format.", media="text/plain"),
            "/": _get("Chat page", "An HTML page that chats with the served model through /v1.", media="text/html"),
        },
        "components": {"schemas": {**defs["$defs"], "Error": ERROR_SCHEMA, "AnthropicError": ANTHROPIC_ERROR_SCHEMA}},
    }
