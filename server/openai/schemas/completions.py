"""The body of ``POST /v1/completions``."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, ValidationInfo, field_validator

from server.openai.schemas.base import INT64_MAX, MAX_COMPLETION_LOGPROBS, MAX_N, invalid, only_off, unsupported
from server.openai.schemas.generation import GenerationRequest, Prompts


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


