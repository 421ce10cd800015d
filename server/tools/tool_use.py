"""Tool calling for one chat request: the one object routes and renderers ask about tools.

Built from the validated request and the model's tokenizer, it owns what the prompt offers, the
grammar that forces calls, and the parsers that turn each choice's text into calls (driven by
``server.generation.output_items``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from server.tools.calls import CallParser
from server.tools.formats import ToolCallFormat, format_for
from server.tools.schema import NamedToolChoice, Tool, ToolChoice
from specdec_core.decoding.structured_output import StructuredOutput


@dataclass(frozen=True)
class ToolUse:
    """``offered``: the functions the prompt offers, none under ``tool_choice: "none"`` (as vLLM
    does by default, so the model is not invited to write calls nobody parses). ``forced``: the
    functions one of which the output must call (decoding is constrained); [] for none/auto.
    ``parallel``: several forced calls in one answer (``required`` with ``parallel_tool_calls``; a
    named function is called exactly once). ``max_calls``: 1 under ``parallel_tool_calls: false``,
    whatever the mode (calls after it are dropped, as vLLM does)."""

    offered: list[dict[str, Any]]
    forced: list[str]
    parallel: bool
    max_calls: int | None
    format: ToolCallFormat
    tokenizer: Any

    @classmethod
    def from_request(
        cls, tools: list[Tool], tool_choice: ToolChoice | None, parallel_tool_calls: bool, tokenizer: Any
    ) -> "ToolUse":
        offered = [] if tool_choice == "none" else [
            {"name": t.function.name, "description": t.function.description or "",
             "parameters": t.function.parameters or {"type": "object", "properties": {}}} for t in tools]
        forced: list[str] = []
        if isinstance(tool_choice, NamedToolChoice):
            forced = [tool_choice.function.name]
        elif tool_choice == "required":
            forced = [t.function.name for t in tools]
        return cls(offered, forced, tool_choice == "required" and parallel_tool_calls,
                   None if parallel_tool_calls else 1, format_for(tokenizer), tokenizer)

    @property
    def names(self) -> set[str]:
        return {t["name"] for t in self.offered}

    def prompt_messages(self, messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The conversation and extra chat-template arguments; unchanged when no tools are
        involved (no tools offered, no past calls or results in the messages)."""
        if not self.offered and not any(m["role"] == "tool" or m.get("tool_calls") for m in messages):
            return messages, {}
        return self.format.prompt_messages(messages, self.offered, self.tokenizer)

    def constraint(self) -> StructuredOutput | None:
        """The call grammar when a call is forced, else None (the model is free)."""
        if not self.forced:
            return None
        return self.format.grammar(self.offered, self.forced, self.parallel, self.tokenizer)

    def parser(self) -> CallParser:
        return self.format.parser(self.names, self.max_calls)

    def end_check(self) -> Callable[[str], bool]:
        """A choice's stop condition, fed its text as it is generated: True once the answer is
        complete although the model goes on (an exact repeat of a call it made, see
        ``hermes_parser``). Its own parser, so streamed and whole answers stop alike."""
        parser = self.parser()

        def check(text: str) -> bool:
            parser.feed(text)
            return parser.ended

        return check
