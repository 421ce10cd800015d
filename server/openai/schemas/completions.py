"""The body of ``POST /v1/completions``."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, ValidationInfo, field_validator

from server.api.schema_base import INT64_MAX, MAX_COMPLETION_LOGPROBS, MAX_N, invalid, only_off, unsupported
from server.openai.schemas.generation import GenerationRequest, Prompts


class CompletionRequest(GenerationRequest):
    """The body of POST /v1/completions: text or token-id prompts."""

    prompt: Prompts
    suffix: Annotated[str, Field(max_length=0), only_off("Insertion (fill-in-the-middle) is not implemented.", "")] = ""
    echo: bool = False
    max_tokens: int = Field(16, ge=0, le=INT64_MAX, description="0 only with echo: the prompt is scored, not continued.")
    logprobs: int | None = Field(None, ge=0, le=MAX_COMPLETION_LOGPROBS)
    best_of: int | None = Field(None, ge=1, le=MAX_N)

    @field_validator("max_tokens")
    @classmethod
    def _zero_only_with_echo(cls, value: int, info: ValidationInfo) -> int:
        if value == 0 and info.data.get("echo") is not True:
            raise invalid("must be >= 1, got 0 (0 is accepted with 'echo': true, which returns the prompt only).",
                          openai_code="integer_below_min_value")
        return value

    @field_validator("logprobs")
    @classmethod
    def _echoed_logprobs_not_streamed(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and info.data.get("echo") is True and info.data.get("stream") is True:
            raise invalid("together with 'echo' is not available when 'stream' is true: the prompt's "
                          "log-probabilities are only known after its prefill. Ask without streaming.")
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

    @property
    def num_prompt_logprobs(self) -> int | None:
        """``echo`` with ``logprobs`` scores the prompt too (OpenAI), with the larger of the two counts
        when ``prompt_logprobs`` is also given; each answer field is cut to its own count."""
        echoed = self.logprobs if self.echo else None
        if echoed is None or self.prompt_logprobs is None:
            return self.prompt_logprobs if echoed is None else echoed
        return max(echoed, self.prompt_logprobs)


