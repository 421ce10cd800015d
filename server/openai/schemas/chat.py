"""The body of ``POST /v1/chat/completions``: messages, and the tools the model may call."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, ConfigDict, Field, ValidationInfo, field_validator, model_validator

import server.api.limits as limits
from server.api.schema_base import (
    INT64_MAX,
    MAX_CHAT_TOP_LOGPROBS,
    MAX_TOOLS,
    NoFunctionCall,
    NoFunctions,
    Schema,
    _nullable_optionals,
    invalid,
    require_distinct,
    text_as_parts,
    unsupported,
)
from server.openai.schemas.generation import GenerationRequest
from server.tools.schema import AssistantToolCall, NamedToolChoice, Tool, ToolChoice


class ContentPart(Schema):
    """One part of a message's content; only text parts are supported."""

    type: Literal["text"]
    text: str

    @field_validator("type", mode="before")
    @classmethod
    def _text_only(cls, value: Any) -> Any:
        if isinstance(value, str) and value != "text":
            raise unsupported("Content parts of type '{kind}' are not supported.", kind=value[:40])
        return value


def _message_schema(schema: dict[str, Any]) -> None:
    """Say in the JSON schema what ``ChatMessage`` checks across fields: ``tool_call_id`` exactly
    on tool messages."""
    _nullable_optionals(schema)
    schema["if"] = {"properties": {"role": {"const": "tool"}}, "required": ["role"]}
    schema["then"] = {"required": ["tool_call_id"], "properties": {"tool_call_id": {"type": "string"}}}
    schema["else"] = {"properties": {"tool_call_id": {"type": "null"}}}


class ChatMessage(Schema):
    """One message of a conversation ("developer" is read as "system"). An assistant message may
    carry ``tool_calls`` instead of content; a ``tool`` message answers the call ``tool_call_id``."""

    model_config = ConfigDict(json_schema_extra=lambda schema: _message_schema(schema))

    role: Literal["system", "developer", "user", "assistant", "tool"]
    # A string is one text part; the parts' texts are joined (see ``text``). An assistant message
    # that only calls tools may leave it out or null.
    content: Annotated[list[ContentPart], BeforeValidator(text_as_parts("text", "content parts"),
                                                          json_schema_input_type=str | list[ContentPart])]
    name: str | None = None
    tool_calls: list[AssistantToolCall] = []
    tool_call_id: str | None = None
    function_call: NoFunctionCall = None

    @field_validator("role", mode="before")
    @classmethod
    def _no_function_role(cls, value: Any) -> Any:
        if value == "function":
            raise unsupported("Role 'function' is deprecated and not supported; use 'tool' messages.")
        return value

    @model_validator(mode="before")
    @classmethod
    def _calls_need_no_content(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("role") == "assistant" and data.get("tool_calls") and data.get("content") is None:
            return {**data, "content": ""}
        return data

    @model_validator(mode="after")
    def _fields_fit_the_role(self) -> "ChatMessage":
        if self.tool_calls and self.role != "assistant":
            raise invalid("'tool_calls' is only allowed on assistant messages.")
        if (self.tool_call_id is None) == (self.role == "tool"):
            raise invalid("'tool_call_id' is required on tool messages and only allowed there.")
        return self

    @property
    def text(self) -> str:
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(GenerationRequest):
    """The body of POST /v1/chat/completions: messages, rendered with the model's chat template."""

    messages: list[ChatMessage] = Field(min_length=1)
    # Neither given: as many tokens as the context allows (OpenAI's chat default).
    max_tokens: int | None = Field(None, ge=1, le=INT64_MAX)
    max_completion_tokens: int | None = Field(None, ge=1, le=INT64_MAX)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_CHAT_TOP_LOGPROBS)
    # None: not given. An empty list is refused, as OpenAI does ('empty_array').
    tools: list[Tool] | None = Field(None, min_length=1, max_length=MAX_TOOLS)
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True
    functions: NoFunctions = []
    function_call: NoFunctionCall = None

    @field_validator("messages", mode="before")
    @classmethod
    def _messages_within_limit(cls, value: Any, info: ValidationInfo) -> Any:
        return limits.check_list_size(value, info, "max_messages", "messages")

    @field_validator("messages")
    @classmethod
    def _text_within_limit(cls, value: list[ChatMessage], info: ValidationInfo) -> list[ChatMessage]:
        settings = limits.settings_of(info)
        if settings is not None:
            limits.check_prompt_chars(sum(len(m.text) + len(m.name or "") for m in value), settings)
        return value

    @field_validator("max_completion_tokens")
    @classmethod
    def _agrees_with_max_tokens(cls, value: int, info: ValidationInfo) -> int:
        if info.data.get("max_tokens") not in (None, value):
            raise invalid("disagrees with 'max_tokens'; give one of them.")
        return value

    @field_validator("top_logprobs")
    @classmethod
    def _needs_logprobs(cls, value: int, info: ValidationInfo) -> int:
        if info.data.get("logprobs") is not True:
            raise invalid("requires 'logprobs': true.")
        return value

    @property
    def completion_budget(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def budget_param(self) -> str:
        """The field a context-length error names: the one the client used."""
        return "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"

    @property
    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    @field_validator("tools", mode="before")
    @classmethod
    def _tools_within_limits(cls, value: Any, info: ValidationInfo) -> Any:
        """Tool definitions are prompt text too (the template writes them into the prompt): their
        JSON counts toward ``--max-prompt-chars`` with the messages, checked before any definition
        is validated (128 tools of 200 properties once spent 25 s tokenizing a 3.3M-token prompt)."""
        if isinstance(value, list) and len(value) > MAX_TOOLS:
            raise invalid("has {count} tools; at most {limit} are allowed.", count=len(value), limit=MAX_TOOLS)
        settings = limits.settings_of(info)
        if settings is not None and isinstance(value, list) and value:
            messages = info.data.get("messages", [])
            text = sum(len(m.text) + len(m.name or "") for m in messages)
            limits.check_prompt_chars(text + limits.json_chars(value), settings, "messages and tools together")
        return value

    @field_validator("tools")
    @classmethod
    def _distinct_names(cls, value: list[Tool]) -> list[Tool]:
        require_distinct([t.function.name for t in value])
        return value

    @field_validator("tool_choice")
    @classmethod
    def _choice_fits_tools(cls, value: Any, info: ValidationInfo) -> Any:
        names = [t.function.name for t in info.data.get("tools") or []]
        if not names:  # OpenAI refuses it, "none" included: a client sending it meant to send tools
            raise invalid("is only allowed when 'tools' are given.")
        if isinstance(value, NamedToolChoice) and value.function.name not in names:
            raise invalid("names the function '{name}', which is not in 'tools'.", name=value.function.name)
        fmt = info.data.get("response_format")
        if (value == "required" or isinstance(value, NamedToolChoice)) and fmt is not None and fmt.type != "text":
            raise invalid("that forces a tool call cannot be combined with a JSON 'response_format'.")
        return value

    @field_validator("parallel_tool_calls")
    @classmethod
    def _parallel_needs_tools(cls, value: bool, info: ValidationInfo) -> bool:
        if not info.data.get("tools"):
            raise invalid("is only allowed when 'tools' are given.")
        return value


def template_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """The messages as chat templates expect them: ``developer`` is OpenAI's new ``system``,
    and a past call's arguments are an object, not OpenAI's JSON text (templates serialize
    them themselves)."""
    out = []
    for msg in messages:
        entry: dict[str, Any] = {"role": "system" if msg.role == "developer" else msg.role, "content": msg.text}
        if msg.name is not None:
            entry["name"] = msg.name
        if msg.tool_calls:
            entry["tool_calls"] = [
                {"id": c.id, "type": "function",
                 "function": {"name": c.function.name, "arguments": json.loads(c.function.arguments)}}
                for c in msg.tool_calls
            ]
        if msg.tool_call_id is not None:
            entry["tool_call_id"] = msg.tool_call_id
        out.append(entry)
    return out
