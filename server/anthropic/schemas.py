"""The body of ``POST /v1/messages`` (and of ``/v1/messages/count_tokens``) as pydantic models.

Only the Messages API's own shapes are checked here, each error naming the Anthropic field
(``messages[1].content[0].tool_use_id``); ``server.anthropic.translate`` then makes the
``ChatCompletionRequest`` chat validates, and the rest is chat's path.

``system``-role messages inside ``messages`` are accepted (Claude Code sends them), as vLLM and
SGLang do. Accepted without effect (docs/api.md): ``cache_control`` on any block or tool (the prefix cache
needs no marks), ``thinking`` (the served models do not think), ``context_management``, a tool's
``defer_loading``, ``metadata``, ``service_tier``,
``citations: null``, ``output_config.effort``. ``output_config.format`` (JSON schema) constrains the
answer as chat's ``response_format`` does. Refused by name (``unsupported_parameter``): content blocks other than
``text``, ``tool_use`` and ``tool_result`` (images, documents, thinking), tools that are not
custom tools (Anthropic's server tools), ``container`` and ``mcp_servers``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, ValidationInfo, field_validator, model_validator

import server.api.limits as limits
from server.api.schema_base import (
    INT64_MAX,
    MAX_TOOLS,
    NonEmptyStr,
    NumSpeculativeTokens,
    Schema,
    Seed,
    SpeculativeSwitch,
    fields_fit_the_type,
    invalid,
    only_off,
    require_distinct,
    schema_within_caps,
    text_as_parts,
    unsupported,
)
from server.tools.schema import FunctionName, FunctionParameters

BLOCK_TYPES = ("text", "tool_use", "tool_result")
KNOWN_BLOCK_TYPES = {"image", "document", "thinking", "redacted_thinking", "server_tool_use", "web_search_tool_result",
                     "search_result", "container_upload", "mcp_tool_use", "mcp_tool_result", "code_execution_tool_result"}


class AnthropicTextBlock(Schema):
    """A text block (of ``system``, of a tool result)."""

    type: Literal["text"]
    text: str
    cache_control: dict[str, Any] | None = None  # accepted; no effect
    citations: Annotated[None, only_off("Citations are not supported.")] = None


_text_as_blocks = text_as_parts("text", "content blocks")


def _block_type(value: Any) -> Any:
    if isinstance(value, str) and value not in BLOCK_TYPES:
        if value in KNOWN_BLOCK_TYPES:
            raise unsupported("Content blocks of type '{kind}' are not supported; only text and tool blocks are.",
                              kind=value)
        raise invalid("must be 'text', 'tool_use' or 'tool_result', got {kind}.", kind=value[:40])
    return value


TextBlocks = Annotated[list[AnthropicTextBlock], BeforeValidator(_text_as_blocks, json_schema_input_type=str | list[AnthropicTextBlock])]


class AnthropicContentBlock(Schema):
    """A block of a message: ``text``; ``tool_use`` (an assistant's call: ``id``, ``name``,
    ``input``); ``tool_result`` (the user's answer to one: ``tool_use_id``, ``content``). Which
    fields a block needs depends on its type, so they are checked together below."""

    type: Annotated[Literal["text", "tool_use", "tool_result"], BeforeValidator(_block_type)]
    text: str | None = None
    id: str | None = Field(None, min_length=1, max_length=256)
    name: FunctionName | None = None
    input: dict[str, Any] | None = None
    tool_use_id: str | None = Field(None, min_length=1, max_length=256)
    content: TextBlocks | None = None
    is_error: bool = False
    cache_control: dict[str, Any] | None = None  # accepted; no effect
    citations: Annotated[None, only_off("Citations are not supported.")] = None

    @model_validator(mode="after")
    def _fields_fit_the_type(self) -> AnthropicContentBlock:
        need = {"text": ("text",), "tool_use": ("id", "name", "input"), "tool_result": ("tool_use_id",)}[self.type]
        fields_fit_the_type(self, self.type, "block", need, ("text", "id", "name", "input", "tool_use_id", "content"),
                            also=("content",) if self.type == "tool_result" else ())
        return self

    @property
    def result_text(self) -> str:
        return "".join(block.text for block in self.content or [])


Blocks = Annotated[list[AnthropicContentBlock],
                   BeforeValidator(_text_as_blocks, json_schema_input_type=str | list[AnthropicContentBlock])]


class AnthropicMessage(Schema):
    """A turn. ``system`` messages may stand anywhere in ``messages`` (Claude Code puts its
    environment and reminders there); they hold text blocks only."""

    role: Literal["user", "assistant", "system"]
    content: Blocks

    @model_validator(mode="after")
    def _blocks_fit_the_role(self) -> AnthropicMessage:
        kinds = {block.type for block in self.content}
        if self.role == "system" and kinds - {"text"}:
            raise invalid("is a system message, which holds text blocks only.")
        if self.role == "user" and "tool_use" in kinds:
            raise invalid("has a 'tool_use' block, which only assistant messages may have.")
        if self.role == "assistant" and "tool_result" in kinds:
            raise invalid("has a 'tool_result' block, which only user messages may have.")
        return self

    @property
    def text(self) -> str:
        return "".join(block.text or "" for block in self.content if block.type == "text")


class AnthropicTool(Schema):
    """A custom tool: ``name``, ``description``, ``input_schema`` (a JSON schema of an object)."""

    type: str = "custom"
    name: FunctionName
    description: str | None = None
    input_schema: FunctionParameters
    cache_control: dict[str, Any] | None = None  # accepted; no effect
    defer_loading: bool | None = None  # accepted (Claude Code's tool search); every tool is offered

    @field_validator("type", mode="before")
    @classmethod
    def _custom_only(cls, value: Any) -> Any:
        if isinstance(value, str) and value != "custom":
            raise unsupported("Tools of type '{kind}' are not supported; only custom tools (name, input_schema) are.",
                              kind=value[:60])
        return value


class AnthropicToolChoice(Schema):
    type: Literal["auto", "any", "tool", "none"]
    name: FunctionName | None = None
    disable_parallel_tool_use: bool = False

    @model_validator(mode="after")
    def _name_iff_tool(self) -> AnthropicToolChoice:
        if (self.type == "tool") != (self.name is not None):
            raise invalid("needs 'name' when 'type' is \"tool\", and only then.")
        return self


class AnthropicThinking(Schema):
    """Accepted; the served models do not think, so it changes nothing."""

    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(None, ge=0, le=INT64_MAX)
    display: str | None = None


class AnthropicOutputFormat(Schema):
    """``output_config.format``: the answer is JSON matching ``schema`` (decoded under its grammar)."""

    type: Literal["json_schema"]
    json_schema: Annotated[dict[str, Any], AfterValidator(schema_within_caps)] = Field(alias="schema")


class AnthropicOutputConfig(Schema):
    effort: str | None = None  # accepted; no effect
    format: AnthropicOutputFormat | None = None


class MessagesPrompt(Schema):
    """What ``/v1/messages/count_tokens`` takes: the conversation and its tools."""

    model: NonEmptyStr
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: TextBlocks | None = None
    tools: list[AnthropicTool] = Field([], max_length=MAX_TOOLS)
    tool_choice: AnthropicToolChoice | None = None
    thinking: AnthropicThinking | None = None

    @field_validator("messages", mode="before")
    @classmethod
    def _messages_within_limit(cls, value: Any, info: ValidationInfo) -> Any:
        return limits.check_list_size(value, info, "max_messages", "messages")

    @field_validator("messages")
    @classmethod
    def _text_within_limit(cls, value: list[AnthropicMessage], info: ValidationInfo) -> list[AnthropicMessage]:
        settings = limits.settings_of(info)
        if settings is not None:
            chars = sum(len(block.text or "") + len(block.result_text) for m in value for block in m.content)
            limits.check_prompt_chars(chars, settings)
        return value

    @field_validator("tools")
    @classmethod
    def _distinct_names(cls, value: list[AnthropicTool]) -> list[AnthropicTool]:
        require_distinct([t.name for t in value], "tool")
        return value


class MessagesRequest(MessagesPrompt):
    """The body of POST /v1/messages."""

    max_tokens: int = Field(ge=1, le=INT64_MAX)
    stop_sequences: list[NonEmptyStr] = []
    temperature: float = Field(1.0, ge=0.0, le=1.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0, le=INT64_MAX)
    stream: bool = False
    output_config: AnthropicOutputConfig | None = None
    metadata: dict[str, Any] | None = None  # accepted (user_id); no effect
    cache_control: dict[str, Any] | None = None  # accepted; no effect
    service_tier: str | None = None  # accepted; no effect
    context_management: dict[str, Any] | None = None  # accepted (edits of thinking blocks: none here); no effect
    container: Annotated[None, only_off("Containers are not supported.")] = None
    mcp_servers: Annotated[None, only_off("MCP servers are not supported.")] = None
    # specdec's extensions, as on chat
    seed: Seed = None
    speculative: SpeculativeSwitch = True
    num_speculative_tokens: NumSpeculativeTokens = None

    @field_validator("stop_sequences")
    @classmethod
    def _stops_within_limit(cls, value: list[str], info: ValidationInfo) -> list[str]:
        settings = limits.settings_of(info)
        if settings is not None:
            limits.check_stop_strings(value, settings)
        return value
