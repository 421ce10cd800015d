"""The Hermes / Qwen2.5 tool-call format: how tools reach the prompt, how ``tool_choice``
constrains decoding, and how the model's text becomes ``message.tool_calls``.

The model calls a tool by writing, one block per call::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Qwen2.5's chat template takes ``tools`` and asks for exactly this; for a template that does not
(SmolLM2's), ``fallback_system_prompt`` describes the tools and the same format in a system
message. ``required`` and a named function constrain decoding with an llguidance Lark grammar
(``call_grammar``), so the output is always a call whose arguments validate against the tool's
parameters; ``auto`` leaves the model free and ``server.tools.hermes_parser`` parses what it wrote
(call syntax never reaches content; a tool-call format error is never a 500).
"""

from __future__ import annotations

import json
from typing import Any

from server.tools.hermes_parser import CLOSE, OPEN, ToolCallParser
from specdec_core.decoding.finite_schema import has_finite_value
from specdec_core.decoding.structured_output import StructuredOutput


def call_grammar(tools: list[dict[str, Any]], names: list[str], parallel: bool, special_markers: bool) -> str:
    """An llguidance Lark grammar for one call of any of ``names`` (or several, separated by a
    newline, when ``parallel``), each ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``
    with arguments valid against the tool's parameters. ``special_markers``: the tokenizer has
    ``<tool_call>`` / ``</tool_call>`` as single tokens (Qwen2.5); they are then named as tokens, so
    the model writes them as it was trained to, not spelled out byte by byte."""
    by_name = {t["name"]: t for t in tools}
    for name in names:  # a call the model could never finish would be decoded until max_tokens
        if not has_finite_value(by_name[name].get("parameters") or {"type": "object"}):
            raise ValueError(f"forces a call of {name!r}, whose parameters no finite JSON value matches: a required "
                             "property or item refers back to its own schema with no way to end")
    variants = [{
        "type": "object",
        "properties": {"name": {"const": name}, "arguments": by_name[name].get("parameters") or {"type": "object"}},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    } for name in names]
    schema = variants[0] if len(variants) == 1 else {"anyOf": variants}
    schema = {**schema, "x-guidance": {"whitespace_pattern": r"[ \t\n]{0,32}"}}
    open_, close = (OPEN, CLOSE) if special_markers else (json.dumps(OPEN), json.dumps(CLOSE))
    call = f'call: {open_} "\\n" %json{json.dumps(schema)} "\\n" {close}'
    # A newline may end the answer too: Qwen2.5 writes one after every </tool_call> and only then
    # decides whether another call follows. Without it, a newline chosen before the end forced a
    # further call, and "required" calls went on until max_tokens.
    calls = 'call ("\\n" call)*' if parallel else "call"
    return f'start: {calls} "\\n"?\n{call}\n'


def has_marker_tokens(tokenizer: Any) -> bool:
    """Whether ``<tool_call>`` and ``</tool_call>`` are single tokens of this tokenizer."""
    ids = [tokenizer.convert_tokens_to_ids(m) for m in (OPEN, CLOSE)]
    return all(isinstance(i, int) and i != tokenizer.unk_token_id and tokenizer.decode([i]) == m
               for i, m in zip(ids, (OPEN, CLOSE)))


def template_takes_tools(tokenizer: Any) -> bool:
    """Whether the model's chat template renders a ``tools`` argument itself."""
    template = getattr(tokenizer, "chat_template", None) or ""
    return isinstance(template, str) and "tools" in template


def fallback_system_prompt(tools: list[dict[str, Any]]) -> str:
    """The tools and the call format, for a chat template that does not take ``tools``."""
    listed = "\n".join(json.dumps({"type": "function", "function": t}, ensure_ascii=False) for t in tools)
    return (
        "You may call one or more functions to assist with the user query. The functions are:\n"
        f"<tools>\n{listed}\n</tools>\n"
        "To call a function, answer with a JSON object with the function name and arguments inside "
        f"{OPEN}{CLOSE} tags, one block per call:\n"
        f'{OPEN}\n{{"name": <function-name>, "arguments": <args-json-object>}}\n{CLOSE}'
    )


def fallback_messages(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation for a template without tool support: the tools in a system message, past
    calls as the text the model would have written, tool results as user turns."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m["role"] == "tool":
            out.append({"role": "user", "content": f"<tool_response>\n{m['content']}\n</tool_response>"})
        elif m.get("tool_calls"):
            calls = "\n".join(
                f"{OPEN}\n{json.dumps({'name': c['function']['name'], 'arguments': c['function']['arguments']})}\n{CLOSE}"
                for c in m["tool_calls"])
            out.append({"role": "assistant", "content": (m["content"] + "\n" if m["content"] else "") + calls})
        else:
            out.append({k: v for k, v in m.items() if k in ("role", "content", "name")})
    if tools:
        prompt = fallback_system_prompt(tools)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{prompt}"}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out


class HermesFormat:
    """The ``ToolCallFormat`` of Qwen2.5, Hermes and most chat models trained on their data."""

    name = "hermes"

    def prompt_messages(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], tokenizer: Any
    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        if template_takes_tools(tokenizer):
            return messages, {"tools": [{"type": "function", "function": t} for t in tools] or None}
        return fallback_messages(messages, tools), {}

    def grammar(self, tools: list[dict[str, Any]], names: list[str], parallel: bool, tokenizer: Any) -> StructuredOutput:
        return StructuredOutput(lark=call_grammar(tools, names, parallel, has_marker_tokens(tokenizer)))

    def parser(self, tools: set[str], max_calls: int | None) -> ToolCallParser:
        return ToolCallParser(tools, max_calls)
