"""Tool-call formats by name: a model family that writes calls another way is a new module here.

A format says how tools reach the prompt (through the chat template, or a fallback system
message), the grammar that forces a call under ``tool_choice`` ``required`` or a named function,
and how the model's text becomes calls (a streaming parser). Only the Hermes format (Qwen2.5,
Hermes, SmolLM2 through the fallback prompt) exists today.
"""

from __future__ import annotations

from typing import Any, Protocol

from server.tools.calls import CallParser
from server.tools.hermes import HermesFormat
from specdec_core.decoding.structured_output import StructuredOutput


class ToolCallFormat(Protocol):
    name: str

    def prompt_messages(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], tokenizer: Any
    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The messages and the extra chat-template arguments that offer ``tools``."""
        ...

    def grammar(self, tools: list[dict[str, Any]], names: list[str], parallel: bool, tokenizer: Any) -> StructuredOutput:
        """The constraint of a call of one of ``names`` (several if ``parallel``)."""
        ...

    def parser(self, tools: set[str], max_calls: int | None) -> CallParser:
        ...


FORMATS: dict[str, ToolCallFormat] = {"hermes": HermesFormat()}


def format_for(tokenizer: Any) -> ToolCallFormat:
    """The format the model behind ``tokenizer`` was trained to write (Hermes for every model so far)."""
    return FORMATS["hermes"]
