"""The fields both generation endpoints share, and the one way from a request to ``SamplingParams``."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, PlainValidator, ValidationInfo, field_validator, model_validator

import server.api.limits as limits
from server.api.schema_base import (
    INT64_MAX,
    MAX_LOGIT_BIAS,
    MAX_N,
    SEED_MIN,
    CacheSalt,
    NonEmptyList,
    NonEmptyStr,
    NumSpeculativeTokens,
    Schema,
    Seed,
    SpeculativeSwitch,
    TokenId,
    TokenIds,
    TopK,
    invalid,
    schema_within_caps,
)
from server.http.errors import invalid_request
from specdec_core.decoding.sampling_params import MAX_LOGPROBS, LogprobsMode, SamplingParams, outside_vocab
from specdec_core.decoding.structured_output import StructuredOutput


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _prompts(value: Any, info: ValidationInfo) -> list[str | list[int]]:
    """``prompt`` under the server's limits (``server.api.limits``): the number of sequences is checked
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
    json_schema: Annotated[dict[str, Any], AfterValidator(schema_within_caps)] = Field(alias="schema")
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
    seed: Seed = None
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
    top_k: TopK = 0
    speculative: SpeculativeSwitch = True
    num_speculative_tokens: NumSpeculativeTokens = None
    ignore_eos: bool = Field(False, description="Keep generating past end-of-sequence tokens.")
    stop_token_ids: list[TokenId] = Field([], description="Token ids that end a choice (not included in it).")
    prompt_logprobs: int | None = Field(
        None, ge=0, le=MAX_LOGPROBS,
        description="vLLM's: per prompt token, its log-probability and rank and this many most likely alternatives "
                    "(the first token's entry is null). The prompt is then computed whole (no prefix cache).",
    )
    logprobs_mode: LogprobsMode = Field(
        "raw_logprobs", description="raw_logprobs: the model's own distribution (under a grammar, the unconstrained "
                                    "model's); processed_logprobs: the one sampled from (after the grammar mask, "
                                    "logit_bias, penalties, temperature, top_k/top_p). Prompt log-probabilities are raw.",
    )
    cache_salt: CacheSalt = None
    specdec_provenance: bool = Field(
        False, description="Streamed only: each chunk's choice also carries 'provenance', its text in pieces by how "
        "each token was produced (a proposer such as 'draft' or 'ngram', or 'target').",
    )

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
        return limits.check_list_size(value, info, "max_stop_token_ids", "token ids")

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

    @field_validator("prompt_logprobs")
    @classmethod
    def _not_streamed(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and info.data.get("stream") is True:
            raise invalid("is not available when 'stream' is true (as in vLLM): ask without streaming.")
        return value

    @field_validator("specdec_provenance")
    @classmethod
    def _provenance_only_when_streaming(cls, value: bool, info: ValidationInfo) -> bool:
        if value and info.data.get("stream") is not True:
            raise invalid("is only allowed when 'stream' is true (provenance rides on the streamed chunks).")
        return value

    @field_validator("num_speculative_tokens")
    @classmethod
    def _agrees_with_speculative(cls, value: int, info: ValidationInfo) -> int:
        if value > 0 and info.data.get("speculative") is False:
            raise invalid("> 0 contradicts 'speculative': false.")
        return value

    def check_engine_limits(self, vocab_size: int, max_tokens: int) -> None:
        """What the schema cannot know: the vocabulary and the completion budget (400 if broken)."""
        bad = outside_vocab(vocab_size, {"stop_token_ids": self.stop_token_ids,
                                         "logit_bias": (int(key) for key in self.logit_bias)})
        if bad is not None:
            raise invalid_request(
                f"'{bad[0]}' has token id {bad[1]}, outside the vocabulary (valid ids: 0 <= id < {vocab_size}).",
                bad[0], code="invalid_token_id")
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
    def num_prompt_logprobs(self) -> int | None:
        """Top alternatives the engine reports per prompt token; None: no prompt log-probabilities."""
        return self.prompt_logprobs

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
            prompt_logprobs=self.num_prompt_logprobs,
            logprobs_mode=self.logprobs_mode,
            num_speculative_tokens=self.num_speculative_tokens if self.speculative else 0,
            logit_bias={int(key): value for key, value in self.logit_bias.items()},
            min_tokens=self.min_tokens,
            structured=structured if structured is not None else self.structured_output,
            provenance=self.specdec_provenance,
            cache_salt=self.cache_salt,
        )


