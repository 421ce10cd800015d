"""The request bodies of ``/v1/completions`` and ``/v1/chat/completions`` as pydantic models.

Each field's type and bounds are declared once, here; validation, the 400 a client gets (see
``server.openai.parsing``) and the served OpenAPI document (``server.openai.openapi``) all come from these
declarations. Types are strict where OpenAI's are (``max_tokens`` is an integer, not ``"5"``,
``5.5`` or ``true``) and floats must be finite. JSON ``null`` means "not given" everywhere (many
clients send every field, nulls included).

Fields this server does not know are ignored (``extra="allow"``; the route logs their names), as
OpenAI and vLLM do, so a client written for a newer API still works. Known OpenAI fields whose
feature is not implemented (``suffix``, ``best_of`` other than ``n``, non-text content, the
deprecated ``functions``) are refused by name instead: ignoring them would silently change what
the client gets.

Extensions (documented in ``specdec serve --help``): ``top_k`` (0 or -1 = off),
``num_speculative_tokens`` (int >= 0: caps k for this request, 0 = no speculation),
``speculative`` (``false`` = no speculation), ``ignore_eos``, ``stop_token_ids``, ``min_tokens``,
and ``response_format`` on completions too.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Annotated, Any, Literal, TypeVar

import jsonschema
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, PlainValidator, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from specdec_core.decoding.sampling_params import SamplingParams
from specdec_core.decoding.structured_output import StructuredOutput

import server.openai.limits as limits
from server.http.errors import invalid_request

MAX_N = 128
MAX_LOGIT_BIAS = 1024
MAX_COMPLETION_LOGPROBS = 5
MAX_CHAT_TOP_LOGPROBS = 20
# Integers are int64 (as in OpenAI's API): a bound on every integer field keeps absurd values
# (JSON integers are unbounded) a clear range error instead of arithmetic on 4000-digit numbers.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
SEED_MIN, SEED_MAX = INT64_MIN, INT64_MAX
LEGACY_FUNCTIONS = "The deprecated 'functions' and 'function_call' are not supported; use 'tools' and 'tool_choice'."
T = TypeVar("T")


def invalid(message: str, **context: Any) -> PydanticCustomError:
    """A validation error whose message completes "'<param>' ..." (see ``server.openai.parsing``).
    Values from the request go in ``context``, never into the template itself."""
    return PydanticCustomError("invalid_value", message, context)


def unsupported(detail: str, **context: Any) -> PydanticCustomError:
    """A known OpenAI feature this server does not implement: a 400 with code ``unsupported_parameter``."""
    return PydanticCustomError("unsupported_parameter", detail, context)


def _nullable_optionals(schema: dict[str, Any]) -> None:
    """Say in the JSON schema what ``_null_means_absent`` does: every optional field accepts null."""
    required = set(schema.get("required", ()))
    for name, prop in schema.get("properties", {}).items():
        if name in required or prop.get("type") == "null" or {"type": "null"} in prop.get("anyOf", ()):
            continue
        meta = {key: prop.pop(key) for key in ("title", "default", "description") if key in prop}
        schema["properties"][name] = {"anyOf": [prop, {"type": "null"}], **meta}


class Schema(BaseModel):
    """Common configuration: strict types, finite floats, unknown fields kept aside (see module doc)."""

    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False, json_schema_extra=_nullable_optionals)

    @model_validator(mode="before")
    @classmethod
    def _null_means_absent(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {key: value for key, value in data.items() if value is not None}
        return data

    def unknown_fields(self, prefix: str = "") -> list[str]:
        """Paths (``messages[0].foo``) of every field this model and its parts ignored."""
        found = [f"{prefix}{name}" for name in self.model_extra or {}]
        for name in type(self).model_fields:
            value = getattr(self, name)
            items = enumerate(value) if isinstance(value, list) else [(None, value)]
            for i, item in items:
                if isinstance(item, Schema):
                    found += item.unknown_fields(f"{prefix}{name}" + ("" if i is None else f"[{i}]") + ".")
        return found


def only_off(detail: str, *off: Any) -> BeforeValidator:
    """For a feature this server lacks: accept only the values that leave it off (null is always
    accepted: it means "not given"), refuse anything else by name before any type check. The
    field's type is declared as narrowly, so the JSON schema tells clients the same."""

    def check(value: Any) -> Any:
        if not any(type(value) is type(ok) and value == ok for ok in off):
            raise unsupported(detail)
        return value

    return BeforeValidator(check)


NoFunctions = Annotated[list[dict[str, Any]], Field(max_length=0), only_off(LEGACY_FUNCTIONS, [])]
NoFunctionCall = Annotated[None, only_off(LEGACY_FUNCTIONS)]

NonEmptyStr = Annotated[str, Field(min_length=1)]
TokenId = Annotated[int, Field(ge=0, le=INT64_MAX)]
NonEmptyList = Annotated[list[T], Field(min_length=1)]
TokenIds = NonEmptyList[TokenId]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _prompts(value: Any, info: ValidationInfo) -> list[str | list[int]]:
    """``prompt`` under the server's limits (``server.openai.limits``): the number of sequences is checked
    before any prompt is looked at, the characters of text before anything is tokenized."""
    settings = limits.settings_of(info)
    if settings is not None:
        # One array of token ids is one prompt; any other array holds one prompt per item.
        count = len(value) if isinstance(value, list) and value and not _is_int(value[0]) else 1
        limits.check_sequences(count, info.data.get("n", 1), settings)
    prompts = _prompt_forms(value)
    if settings is not None:
        limits.check_prompt_chars(sum(len(p) for p in prompts if isinstance(p, str)), settings)
    return prompts


def _prompt_forms(value: Any) -> list[str | list[int]]:
    """OpenAI's four prompt forms, as a list of prompts (each text or token ids). Every problem
    is reported against ``prompt`` as a whole: which form was meant is a guess."""
    forms = "must be a string, an array of strings, an array of token ids, or an array of arrays of token ids."
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise invalid(forms)
    if not value:
        raise invalid("must not be empty.")
    if all(isinstance(p, str) for p in value):
        return list(value)
    if all(_is_int(t) for t in value):
        return [list(value)]
    if all(isinstance(p, list) for p in value):
        if not all(p and all(_is_int(t) for t in p) for p in value):
            raise invalid("must hold non-empty arrays of integer token ids.")
        return [list(p) for p in value]
    raise invalid(forms)


def _stops(value: Any, info: ValidationInfo) -> list[str]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise invalid("must be a string or an array of strings.")
    if "" in items:
        raise invalid("strings must not be empty.")
    settings = limits.settings_of(info)
    if settings is not None:
        limits.check_stop_strings(items, settings)
    return list(items)


Prompts = Annotated[
    list[str | list[int]],
    PlainValidator(_prompts, json_schema_input_type=str | NonEmptyList[str] | TokenIds | NonEmptyList[TokenIds]),
]
Stops = Annotated[list[str], PlainValidator(_stops, json_schema_input_type=NonEmptyStr | list[NonEmptyStr])]


class StreamOptions(Schema):
    """Options of a streamed response (only with "stream": true)."""

    include_usage: bool = Field(False, description="Send a last chunk with the usage of the whole request.")


class JsonSchemaFormat(Schema):
    """OpenAI's ``response_format.json_schema``: a named JSON schema the output must match."""

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    # "schema" would shadow a pydantic BaseModel attribute: stored as json_schema, sent as "schema".
    json_schema: dict[str, Any] = Field(alias="schema")
    # Output is always constrained to the schema; strict only says the client expects it to be.
    strict: bool | None = None


class ResponseFormat(Schema):
    """``text`` (unconstrained), ``json_object`` (any JSON object) or ``json_schema``. The JSON
    formats constrain decoding with a grammar (``specdec_core.decoding.grammar``), under speculation too."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_iff_json_schema(self) -> "ResponseFormat":
        if self.type == "json_schema" and self.json_schema is None:
            raise invalid("needs 'json_schema' when 'type' is \"json_schema\".")
        if self.type != "json_schema" and self.json_schema is not None:
            raise invalid("'json_schema' is only allowed when 'type' is \"json_schema\".")
        return self

    @property
    def structured(self) -> StructuredOutput | None:
        if self.type == "json_object":
            return StructuredOutput(json_object=True)
        if self.type == "json_schema":
            return StructuredOutput(json_schema=self.json_schema.json_schema)  # type: ignore[union-attr]
        return None


class GenerationRequest(Schema):
    """Fields both endpoints share, and the one way to engine ``SamplingParams``."""

    model: str | None = None
    n: int = Field(1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: Stops = []
    seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    user: str | None = None  # accepted; only meaningful to OpenAI's abuse monitoring
    logit_bias: dict[str, Annotated[float, Field(ge=-100.0, le=100.0)]] = Field(
        {}, max_length=MAX_LOGIT_BIAS, description="Token id (as a string) -> value added to its logit, in [-100, 100].",
        json_schema_extra={"propertyNames": {"pattern": "^[0-9]{1,19}$"}},
    )
    min_tokens: int = Field(0, ge=0, le=INT64_MAX, description="EOS and stop_token_ids are masked until this many tokens.")
    response_format: ResponseFormat = Field(
        ResponseFormat(type="text"), description="json_object / json_schema: decoding is constrained to match."
    )
    # extensions
    top_k: int = Field(0, ge=-1, le=INT64_MAX, description="Sample from the k most likely tokens; 0 or -1: off.")
    speculative: bool = Field(True, description="false: no speculation for this request.")
    num_speculative_tokens: int | None = Field(
        None, ge=0, le=INT64_MAX, description="Caps the draft length k for this request; 0: no speculation."
    )
    ignore_eos: bool = Field(False, description="Keep generating past end-of-sequence tokens.")
    stop_token_ids: list[TokenId] = Field([], description="Token ids that end a choice (not included in it).")

    @field_validator("n")
    @classmethod
    def _n_within_limit(cls, value: int, info: ValidationInfo) -> int:
        settings = limits.settings_of(info)
        if settings is not None:
            limits.check_sequences(1, value, settings)
        return value

    @field_validator("stop_token_ids", mode="before")
    @classmethod
    def _stop_ids_within_limit(cls, value: Any, info: ValidationInfo) -> Any:
        settings = limits.settings_of(info)
        if settings is not None and isinstance(value, list):  # counted before the ids are validated
            limits.check_count(len(value), settings.max_stop_token_ids, "max_stop_token_ids", "token ids")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _token_id_keys(cls, value: dict[str, float]) -> dict[str, float]:
        for key in value:
            if not (key.isascii() and key.isdigit() and len(key) <= 19):
                raise invalid("keys must be token ids written as decimal strings, got {key}.", key=key[:40])
        return value

    @field_validator("stream_options")
    @classmethod
    def _only_when_streaming(cls, value: StreamOptions, info: ValidationInfo) -> StreamOptions:
        if info.data.get("stream") is not True:
            raise invalid("is only allowed when 'stream' is true.")
        return value

    @field_validator("num_speculative_tokens")
    @classmethod
    def _agrees_with_speculative(cls, value: int, info: ValidationInfo) -> int:
        if value > 0 and info.data.get("speculative") is False:
            raise invalid("> 0 contradicts 'speculative': false.")
        return value

    def check_engine_limits(self, vocab_size: int, max_tokens: int) -> None:
        """What the schema cannot know: the vocabulary and the completion budget (400 if broken)."""
        bad = [key for key in self.logit_bias if int(key) >= vocab_size]
        if bad:
            raise invalid_request(
                f"'logit_bias' has token id {bad[0]}, outside the vocabulary (valid ids: 0 <= id < {vocab_size}).",
                "logit_bias", code="invalid_token_id")
        if self.min_tokens > max_tokens:
            raise invalid_request(
                f"'min_tokens' ({self.min_tokens}) is more than the completion may have ({max_tokens} tokens).", "min_tokens")

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def num_logprobs(self) -> int | None:
        """Top alternatives the engine reports per token; None: no log-probabilities at all."""
        raise NotImplementedError

    @property
    def structured_output(self) -> StructuredOutput | None:
        """What decoding is constrained to, if anything."""
        return self.response_format.structured

    def to_sampling_params(
        self, max_tokens: int, choice: int, structured: StructuredOutput | None = None
    ) -> SamplingParams:
        """Engine parameters for one choice; choice i of a seeded request uses seed + i (wrapping
        within int64), so choices differ from each other yet the request stays reproducible.
        ``structured``: the constraint to decode under (default: the ``response_format``'s)."""
        seed = None
        if self.seed is not None:
            seed = (self.seed + choice - SEED_MIN) % 2**64 + SEED_MIN
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=max(self.top_k, 0),
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            seed=seed,
            stop=list(self.stop),
            stop_token_ids=list(self.stop_token_ids),
            ignore_eos=self.ignore_eos,
            logprobs=self.num_logprobs,
            num_speculative_tokens=self.num_speculative_tokens if self.speculative else 0,
            logit_bias={int(key): value for key, value in self.logit_bias.items()},
            min_tokens=self.min_tokens,
            structured=structured if structured is not None else self.structured_output,
        )


class CompletionRequest(GenerationRequest):
    """The body of POST /v1/completions: text or token-id prompts."""

    prompt: Prompts
    suffix: Annotated[str, Field(max_length=0), only_off("Insertion (fill-in-the-middle) is not implemented.", "")] = ""
    max_tokens: int = Field(16, ge=1, le=INT64_MAX)
    logprobs: int | None = Field(None, ge=0, le=MAX_COMPLETION_LOGPROBS)
    echo: bool = False
    best_of: int | None = Field(None, ge=1, le=MAX_N)

    @field_validator("echo")
    @classmethod
    def _echo_without_logprobs(cls, value: bool, info: ValidationInfo) -> bool:
        if value and info.data.get("logprobs") is not None:
            raise invalid(
                "together with 'logprobs' is not supported: the engine does not compute prompt log-probabilities."
            )
        return value

    @field_validator("best_of")
    @classmethod
    def _best_of_is_n(cls, value: int, info: ValidationInfo) -> int:
        if value != info.data.get("n", value):
            raise unsupported("Only best_of == n (or omitted) is accepted; candidates are never discarded.")
        return value

    @property
    def num_logprobs(self) -> int | None:
        return self.logprobs


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


def _text_as_parts(value: Any) -> Any:
    if isinstance(value, str):
        return [{"type": "text", "text": value}]
    if not isinstance(value, list):
        raise invalid("must be a string or an array of content parts.")
    return value


FunctionName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]


MAX_PARAMETERS_DEPTH = 64
MAX_CACHED_SCHEMA_BYTES = 64 * 1024  # the meta-schema cache holds at most 256 x 64 KiB


def _nesting_depth(value: Any) -> int:
    """How deeply objects and arrays nest in ``value``, counted without recursion (a body may nest
    a thousand levels; the meta-schema check below recurses several frames per level)."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth)
            todo.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def _parameters_schema(value: dict[str, Any] | None) -> dict[str, Any] | None:
    """A function's ``parameters`` must be a JSON schema (checked against its draft's meta-schema,
    2020-12 unless ``$schema`` says otherwise) of an object, as OpenAI requires: a bad one is a 400
    naming it rather than a prompt the model cannot follow or a grammar that fails later."""
    if value is None:
        return value
    if _nesting_depth(value) > MAX_PARAMETERS_DEPTH:
        raise invalid("nests deeper than {limit} levels.", limit=MAX_PARAMETERS_DEPTH)
    text = json.dumps(value, sort_keys=True)  # not orjson: a body may hold integers beyond 64 bits
    check = _meta_schema_problem if len(text) <= MAX_CACHED_SCHEMA_BYTES else _meta_schema_problem.__wrapped__
    problem = check(text)
    if problem is not None:
        raise invalid("is not a valid JSON schema: {reason}", reason=problem)
    if value.get("type", "object") != "object":
        raise invalid('must be the JSON schema of an object ("type": "object").')
    return value


@functools.lru_cache(maxsize=256)
def _meta_schema_problem(schema_json: str) -> str | None:
    """Why a schema fails its meta-schema, or None. Cached by the schema's text: checking one
    against the 2020-12 meta-schema takes ~5 ms, and a chat app sends the same tools every turn."""
    schema = json.loads(schema_json)
    validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        validator.check_schema(schema)
    except jsonschema.SchemaError as err:
        return err.message
    return None


class FunctionDefinition(Schema):
    """A tool the model may call: its name, what it does, and a JSON schema of its arguments."""

    name: FunctionName
    description: str | None = None
    parameters: Annotated[dict[str, Any] | None, AfterValidator(_parameters_schema)] = None
    strict: bool | None = None  # accepted; calls forced by tool_choice always match the schema


class Tool(Schema):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(Schema):
    name: FunctionName


class NamedToolChoice(Schema):
    """``{"type": "function", "function": {"name": ...}}``: call exactly this tool."""

    type: Literal["function"]
    function: NamedFunction


TOOL_CHOICE_FORMS = 'must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}.'
ToolMode = Literal["none", "auto", "required"]


def _tool_choice(value: Any) -> str | NamedToolChoice:
    """One of the modes or a named function; a bad value is reported against ``tool_choice``
    itself (a pydantic union would name its members in the error's location)."""
    if isinstance(value, str) and value in ("none", "auto", "required"):
        return value
    function = value.get("function") if isinstance(value, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if value.get("type") != "function" if isinstance(value, dict) else True:
        raise invalid(TOOL_CHOICE_FORMS)
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", name):
        raise invalid(TOOL_CHOICE_FORMS)
    return NamedToolChoice(type="function", function=NamedFunction(name=name))


ToolChoice = Annotated[ToolMode | NamedToolChoice, PlainValidator(_tool_choice, json_schema_input_type=ToolMode | NamedToolChoice)]


class FunctionCall(Schema):
    name: FunctionName
    arguments: str  # a JSON object, as text (OpenAI's format)

    @field_validator("arguments")
    @classmethod
    def _json_object(cls, value: str) -> str:
        try:
            parsed = json.loads(value)
        except ValueError:
            raise invalid("must be a JSON object written as a string.") from None
        if not isinstance(parsed, dict):
            raise invalid("must be a JSON object written as a string.")
        return value


class AssistantToolCall(Schema):
    """A call the assistant made earlier in the conversation."""

    id: str
    type: Literal["function"]
    function: FunctionCall


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
    content: Annotated[list[ContentPart], BeforeValidator(_text_as_parts, json_schema_input_type=str | list[ContentPart])]
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
    tools: list[Tool] = Field([], max_length=128)
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True
    functions: NoFunctions = []
    function_call: NoFunctionCall = None

    @field_validator("messages", mode="before")
    @classmethod
    def _messages_within_limit(cls, value: Any, info: ValidationInfo) -> Any:
        settings = limits.settings_of(info)
        if settings is not None and isinstance(value, list):  # counted before the messages are validated
            limits.check_count(len(value), settings.max_messages, "max_messages", "messages")
        return value

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

    def template_messages(self) -> list[dict[str, Any]]:
        """The messages as chat templates expect them: ``developer`` is OpenAI's new ``system``,
        and a past call's arguments are an object, not OpenAI's JSON text (templates serialize
        them themselves)."""
        out = []
        for msg in self.messages:
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

    @field_validator("tools")
    @classmethod
    def _distinct_names(cls, value: list[Tool]) -> list[Tool]:
        names = [t.function.name for t in value]
        if len(set(names)) != len(names):
            raise invalid("names a function twice.")
        return value

    @field_validator("tool_choice")
    @classmethod
    def _choice_fits_tools(cls, value: Any, info: ValidationInfo) -> Any:
        names = [t.function.name for t in info.data.get("tools", [])]
        if isinstance(value, NamedToolChoice) and value.function.name not in names:
            raise invalid("names the function '{name}', which is not in 'tools'.", name=value.function.name)
        if value == "required" and not names:
            raise invalid("\"required\" needs 'tools'.")
        fmt = info.data.get("response_format")
        if (value == "required" or isinstance(value, NamedToolChoice)) and fmt is not None and fmt.type != "text":
            raise invalid("that forces a tool call cannot be combined with a JSON 'response_format'.")
        return value

    @property
    def offered_tools(self) -> list[dict[str, Any]]:
        """The functions the prompt offers: none when ``tool_choice`` is ``"none"`` (as vLLM does by
        default), so the model is not invited to write calls nobody parses."""
        if self.tool_choice == "none":
            return []
        return [{"name": t.function.name, "description": t.function.description or "",
                 "parameters": t.function.parameters or {"type": "object", "properties": {}}} for t in self.tools]

    @property
    def parallel_calls_allowed(self) -> bool:
        """Several calls in one answer: with ``required`` and ``parallel_tool_calls`` (a named
        function is called exactly once)."""
        return self.tool_choice == "required" and self.parallel_tool_calls

    @property
    def max_tool_calls(self) -> int | None:
        """Calls one answer may make: 1 under ``parallel_tool_calls: false``, whatever the mode."""
        return None if self.parallel_tool_calls else 1

    @property
    def forced_tools(self) -> list[str]:
        """Functions one of which the output must call (decoding is constrained); [] for none/auto."""
        if isinstance(self.tool_choice, NamedToolChoice):
            return [self.tool_choice.function.name]
        if self.tool_choice == "required":
            return [t.function.name for t in self.tools]
        return []
