"""The body of ``POST /v1/responses`` (OpenAI's Responses API) as a pydantic model.

Only the Responses API's own shapes are checked here, each error naming the Responses field
(``input[2].call_id``); ``server.openai.responses_input`` then translates the body into the
``ChatCompletionRequest`` chat validates, and everything after that is chat's path.

Accepted but without effect, as documented in docs/api.md: ``reasoning`` (the served models do not
reason), ``truncation: "disabled"``, ``text.verbosity``, ``include`` entries about items this
server never produces, ``service_tier``, ``safety_identifier``, ``prompt_cache_key``,
``prompt_cache_retention``, ``stream_options``, ``reasoning`` input items (left out of the
prompt). Tools of types the provider would run (``web_search`` ...) are left out of the prompt
with a warning (``server.openai.responses_tools``). Refused by name (``unsupported_parameter``):
input items other than messages, reasoning, function and custom tool calls and their outputs;
non-text content (images, files); ``truncation: "auto"``, ``background``, ``top_logprobs``,
``max_tool_calls``, ``prompt``, ``conversation``, ``context_management`` and the logprobs include.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, PlainValidator, ValidationInfo, field_validator, model_validator

import server.api.limits as limits
from server.api.schema_base import (
    INT64_MAX,
    MAX_SCHEMA_CHARS,
    MAX_TOOLS,
    CacheSalt,
    NumSpeculativeTokens,
    Schema,
    Seed,
    SpeculativeSwitch,
    TopK,
    fields_fit_the_type,
    invalid,
    only_off,
    require_distinct,
    schema_within_caps,
    text_as_parts,
    unsupported,
)
from server.http.jsonio import loads_bounded
from server.openai.responses_tools import joined_name
from server.tools.schema import FUNCTION_NAME, FunctionName, FunctionParameters

# Item and content types OpenAI defines that this server does not take: refused by name (any
# other type is a plain invalid value).
KNOWN_ITEM_TYPES = {
    "item_reference", "reasoning", "file_search_call", "computer_call", "computer_call_output", "web_search_call",
    "image_generation_call", "code_interpreter_call", "local_shell_call", "local_shell_call_output", "shell_call",
    "shell_call_output", "apply_patch_call", "apply_patch_call_output", "mcp_list_tools", "mcp_approval_request",
    "mcp_approval_response", "mcp_call", "compaction",
}
# Served: messages, calls of functions and custom tools and their outputs; reasoning items are
# accepted and left out of the prompt (the served models write none; another model's are opaque).
ITEM_TYPES = ("message", "function_call", "function_call_output", "custom_tool_call", "custom_tool_call_output", "reasoning")
TEXT_PARTS = ("input_text", "output_text")
LOGPROBS_INCLUDE = "message.output_text.logprobs"
MAX_METADATA = 16


class ResponsesContentPart(Schema):
    """A text part of a message (``input_text``; ``output_text`` in an earlier answer sent back)."""

    type: str
    text: str
    # what an answer's output_text carries, sent back as is by clients (the Agents SDK): no effect
    annotations: list[Any] = []
    logprobs: list[Any] = []

    @field_validator("type", mode="before")
    @classmethod
    def _text_only(cls, value: Any) -> Any:
        if isinstance(value, str) and value not in TEXT_PARTS:
            raise unsupported("Content parts of type '{kind}' are not supported; only text is.", kind=value[:40])
        return value


TextParts = Annotated[list[ResponsesContentPart], BeforeValidator(text_as_parts("input_text", "content parts"),
                                                    json_schema_input_type=str | list[ResponsesContentPart])]


def _item_type(value: Any) -> Any:
    if isinstance(value, str) and value not in ITEM_TYPES:
        if value in KNOWN_ITEM_TYPES:
            raise unsupported("Input items of type '{kind}' are not supported.", kind=value)
        raise invalid("must be one of {kinds}, got {kind}.", kinds=", ".join(f"'{t}'" for t in ITEM_TYPES), kind=value[:40])
    return value


ItemType = Literal["message", "function_call", "function_call_output", "custom_tool_call", "custom_tool_call_output",
                   "reasoning"]
ITEM_FIELDS = ("role", "content", "call_id", "name", "namespace", "arguments", "input", "output")
# type -> (the fields it needs, the others it may carry)
FIELDS_OF_TYPE: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "message": (("role", "content"), ()),
    "function_call": (("call_id", "name", "arguments"), ("namespace",)),
    "custom_tool_call": (("call_id", "name", "input"), ("namespace",)),
    "function_call_output": (("call_id", "output"), ("name",)),  # an output may repeat its call's name
    "custom_tool_call_output": (("call_id", "output"), ("name",)),
    "reasoning": ((), ()),
}


class InputItem(Schema):
    """One input item: a message (the default when ``type`` is left out), an earlier answer's
    ``function_call`` or ``custom_tool_call``, an output answering one, or a ``reasoning`` item
    (accepted; not part of the prompt). Which fields an item needs depends on its type, so they are
    optional here and checked together below."""

    type: Annotated[ItemType, BeforeValidator(_item_type)] = "message"
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None
    # message
    role: Literal["user", "assistant", "system", "developer"] | None = None
    content: TextParts | None = None
    # function_call / custom_tool_call (and the call_id of its output)
    call_id: str | None = Field(None, min_length=1, max_length=256)
    name: Annotated[str, Field(pattern=f"^{FUNCTION_NAME}$")] | None = None
    namespace: Annotated[str, Field(pattern=f"^{FUNCTION_NAME}$")] | None = None
    arguments: str | None = None
    input: str | None = None
    # function_call_output / custom_tool_call_output
    output: TextParts | None = None
    # reasoning: what another model thought; opaque, so no part of the prompt
    summary: list[Any] | None = None
    encrypted_content: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _reasoning_content_is_opaque(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("type") == "reasoning":
            return {key: value for key, value in data.items() if key != "content"}
        return data

    @model_validator(mode="after")
    def _fields_fit_the_type(self) -> InputItem:
        need, also = FIELDS_OF_TYPE[self.type]
        fields_fit_the_type(self, self.type, "item", need, ITEM_FIELDS, also=also)
        if self.arguments is not None:
            try:
                parsed = loads_bounded(self.arguments)
            except ValueError as exc:
                raise invalid("has 'arguments' that are not JSON ({reason}).", reason=str(exc)[:200]) from None
            if not isinstance(parsed, dict):
                raise invalid("has 'arguments' that are not a JSON object.")
        return self

    @property
    def text(self) -> str:
        return "".join(part.text for part in (self.content or self.output or []))


def _input_as_items(value: Any, info: ValidationInfo) -> Any:
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    if not isinstance(value, list):
        raise invalid("must be a string or an array of input items.")
    return limits.check_list_size(value, info, "max_messages", "items")


class CustomToolFormat(Schema):
    """A custom tool's input: free ``text``, or text in a ``grammar`` (``syntax`` lark or regex)."""

    type: Literal["text", "grammar"]
    syntax: Literal["lark", "regex"] | None = None
    definition: str | None = Field(None, max_length=MAX_SCHEMA_CHARS)

    @model_validator(mode="after")
    def _grammar_has_a_definition(self) -> CustomToolFormat:
        if (self.type == "grammar") != (self.definition is not None and self.syntax is not None):
            raise invalid("needs 'syntax' and 'definition' when 'type' is \"grammar\", and only then.")
        return self


SERVED_TOOL_TYPES = ("function", "custom", "namespace")


class ResponsesTool(Schema):
    """A tool: a ``function`` (``name``, ``parameters``; ``strict`` is accepted: a call that
    ``tool_choice`` forces always matches ``parameters``), a ``custom`` tool (``name``, ``format``),
    a ``namespace`` of either (``name``, ``tools``), or a tool the provider runs (``web_search``
    ...), which this server leaves out (``server.openai.responses_tools``). Which fields a tool needs
    depends on its type, so they are optional here and checked together below."""

    type: Annotated[str, Field(min_length=1, max_length=64)]
    name: FunctionName | None = None
    description: str | None = None
    parameters: FunctionParameters = None
    strict: bool | None = None
    format: CustomToolFormat | None = None
    tools: list[ResponsesTool] | None = Field(None, max_length=MAX_TOOLS)
    defer_loading: bool | None = None  # accepted (Codex's tool search); every tool is offered

    @model_validator(mode="after")
    def _fields_fit_the_type(self) -> ResponsesTool:
        if self.type not in SERVED_TOOL_TYPES:
            return self  # left out of the prompt whatever it holds
        need = {"function": ("name",), "custom": ("name",), "namespace": ("name", "tools")}[self.type]
        also = {"function": ("parameters", "strict"), "custom": ("format",), "namespace": ()}[self.type]
        fields_fit_the_type(self, self.type, "tool", need, ("name", "parameters", "strict", "format", "tools"), also=also)
        if any(inner.type not in ("function", "custom") for inner in self.tools or []):
            raise invalid("is a namespace, whose tools are functions or custom tools.")
        return self


ToolMode = Literal["none", "auto", "required"]
TOOL_CHOICE_FORMS = 'must be "none", "auto", "required" or {"type": "function" or "custom", "name": ...}.'


def _tool_choice(value: Any) -> str | dict[str, str]:
    if isinstance(value, str) and value in ("none", "auto", "required"):
        return value
    if not isinstance(value, dict):
        raise invalid(TOOL_CHOICE_FORMS)
    kind = value.get("type")
    if isinstance(kind, str) and kind not in ("function", "custom"):
        raise unsupported("A 'tool_choice' of type '{kind}' is not supported.", kind=kind[:40])
    name = value.get("name")
    if kind not in ("function", "custom") or not isinstance(name, str) or not re.fullmatch(FUNCTION_NAME, name):
        raise invalid(TOOL_CHOICE_FORMS)
    return {"type": kind, "name": name}


ToolChoice = Annotated[ToolMode | dict[str, str], PlainValidator(_tool_choice, json_schema_input_type=ToolMode | dict[str, str])]


class TextFormat(Schema):
    """``text.format``: ``text``, ``json_object`` or ``json_schema`` (flat: name and schema here)."""

    type: Literal["text", "json_object", "json_schema"]
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")] | None = None
    description: str | None = None
    json_schema: Annotated[dict[str, Any], AfterValidator(schema_within_caps)] | None = Field(None, alias="schema")
    strict: bool | None = None

    @model_validator(mode="after")
    def _schema_iff_json_schema(self) -> TextFormat:
        if self.type == "json_schema" and (self.json_schema is None or self.name is None):
            raise invalid("needs 'name' and 'schema' when 'type' is \"json_schema\".")
        if self.type != "json_schema" and self.json_schema is not None:
            raise invalid("'schema' is only allowed when 'type' is \"json_schema\".")
        return self


class TextConfig(Schema):
    format: TextFormat = Field(default_factory=lambda: TextFormat.model_validate({"type": "text"}))
    verbosity: Literal["low", "medium", "high"] | None = None  # accepted; no effect


class Reasoning(Schema):
    """Accepted and echoed; the served models do not reason, so it changes nothing."""

    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


def _metadata(value: dict[str, str]) -> dict[str, str]:
    if len(value) > MAX_METADATA:
        raise invalid("has {count} keys; at most {limit} are allowed.", count=len(value), limit=MAX_METADATA)
    for key, item in value.items():
        if len(key) > 64 or len(item) > 512:
            raise invalid("keys are at most 64 characters and values at most 512.")
    return value


class ResponsesRequest(Schema):
    """The body of POST /v1/responses (see the module docstring for what is accepted)."""

    model: str | None = None
    input: Annotated[list[InputItem], BeforeValidator(_input_as_items, json_schema_input_type=str | list[InputItem])]
    instructions: str | None = None
    previous_response_id: str | None = Field(None, min_length=1, max_length=256)
    store: bool = True
    stream: bool = False
    stream_options: dict[str, Any] | None = None  # accepted (include_obfuscation); no effect
    max_output_tokens: int | None = Field(None, ge=1, le=INT64_MAX)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    tools: list[ResponsesTool] = Field([], max_length=MAX_TOOLS)
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True
    text: TextConfig = Field(default_factory=TextConfig)
    metadata: Annotated[dict[str, str], AfterValidator(_metadata)] = {}
    user: str | None = None
    include: list[str] = []
    reasoning: Reasoning | None = None
    truncation: Annotated[Literal["disabled"], only_off("Only 'disabled' is: a too-long input is a 400.", "disabled")] = "disabled"
    background: Annotated[bool, only_off("Responses are answered in the request.", False)] = False
    top_logprobs: Annotated[int, only_off("Log-probabilities are available on /v1/chat/completions.", 0)] = 0
    max_tool_calls: Annotated[None, only_off("Use 'parallel_tool_calls': false for one call.")] = None
    prompt: Annotated[None, only_off("Prompt templates are not stored on this server.")] = None
    conversation: Annotated[None, only_off("Continue a conversation with 'previous_response_id'.")] = None
    context_management: Annotated[None, only_off("")] = None
    service_tier: str | None = None  # accepted; no effect
    safety_identifier: str | None = None  # accepted; no effect
    prompt_cache_key: str | None = None  # accepted; the prefix cache needs no key
    prompt_cache_retention: str | None = None  # accepted; no effect
    # specdec's and vLLM's extensions, as on chat
    seed: Seed = None
    top_k: TopK = 0
    speculative: SpeculativeSwitch = True
    num_speculative_tokens: NumSpeculativeTokens = None
    cache_salt: CacheSalt = None

    @field_validator("input")
    @classmethod
    def _text_within_limit(cls, value: list[InputItem], info: ValidationInfo) -> list[InputItem]:
        settings = limits.settings_of(info)
        if settings is not None:
            limits.check_prompt_chars(sum(len(item.text) + len(item.arguments or item.input or "") for item in value), settings)
        return value

    @field_validator("include")
    @classmethod
    def _no_logprobs(cls, value: list[str]) -> list[str]:
        if LOGPROBS_INCLUDE in value:
            raise unsupported("'{name}' is not: log-probabilities are available on /v1/chat/completions.",
                              name=LOGPROBS_INCLUDE)
        return value

    @field_validator("tools")
    @classmethod
    def _distinct_names(cls, value: list[ResponsesTool]) -> list[ResponsesTool]:
        require_distinct([joined_name(tool.name if tool.type == "namespace" else None, inner.name or "")
                          for tool in value if tool.type in SERVED_TOOL_TYPES for inner in (tool.tools or [tool])])
        return value

    @field_validator("stream_options")
    @classmethod
    def _only_when_streaming(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        if info.data.get("stream") is not True:
            raise invalid("is only allowed when 'stream' is true.")
        return value
