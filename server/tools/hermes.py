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
parameters; ``auto`` leaves the model free and parses what it wrote. Text that does not parse as a
call of a declared tool stays content: a tool-call format error is never a 500.
"""

from __future__ import annotations

import json
import re
from typing import Any

from server.http.jsonio import loads_bounded
from server.tools.calls import ToolCall
from specdec_core.decoding.structured_output import StructuredOutput

OPEN, CLOSE = "<tool_call>", "</tool_call>"


def parse_call(body: str, tools: set[str]) -> ToolCall | None:
    """The call inside one ``<tool_call>`` block, or None when it is not a call of a declared tool
    (text that is not JSON, or nests too deeply to be a real call, stays content)."""
    try:  # bounded: a grammar can make the model nest thousands of levels
        obj = loads_bounded(body)
    except ValueError:
        return None
    if not isinstance(obj, dict) or obj.get("name") not in tools:
        return None
    arguments = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string already
        try:
            arguments = loads_bounded(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(obj["name"], json.dumps(arguments, ensure_ascii=False))


class ToolCallParser:
    """Splits streamed text into content and complete tool calls.

    Content streams as it arrives, except a tail that may be the start of ``<tool_call>`` and
    trailing whitespace (the newlines around calls are not content). A call is sent once its block
    is closed and parses; a block that does not parse, or is still open when the output ends, is
    sent as the plain content it is.

    Some models asked for the tagged format answer with the bare call instead, as a JSON object
    or a fenced ``json`` block and nothing else (Qwen2.5-Coder-1.5B does, with ``tool_choice``
    ``"auto"``). An output that starts like that is held back until it ends: if all of it is one
    call of a declared tool it is that call, otherwise it is sent as content then.

    ``max_calls`` (1 under ``parallel_tool_calls: false``): calls after that many are dropped, as
    vLLM does; a grammar cannot enforce it under ``"auto"``, where the model is free.
    """

    def __init__(self, tools: set[str], max_calls: int | None = None) -> None:
        self.tools = tools
        self.max_calls = max_calls
        self._buffer = ""
        self._whitespace = ""  # held back until content follows it
        self._in_call = False
        self._bare: str | None = ""  # the output so far while it may be a bare call; None once not
        self.num_calls = 0

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        if self._bare is not None:
            self._bare += text
            if _may_be_bare_call(self._bare):
                return "", []
            text, self._bare = self._bare, None
        self._buffer += text
        content, calls = "", list[ToolCall]()
        while True:
            if not self._in_call:
                start = self._buffer.find(OPEN)
                if start < 0:
                    keep = _partial_suffix(self._buffer, OPEN)
                    content += self._buffer[: len(self._buffer) - keep]
                    self._buffer = self._buffer[len(self._buffer) - keep:]
                    break
                content += self._buffer[:start]
                self._buffer = self._buffer[start:]
                self._in_call = True
            end = self._buffer.find(CLOSE)
            if end < 0:
                break
            block = self._buffer[: end + len(CLOSE)]
            self._buffer = self._buffer[end + len(CLOSE):]
            self._in_call = False
            call = parse_call(block[len(OPEN): -len(CLOSE)], self.tools)
            if call is None:
                content += block
            elif self.max_calls is None or self.num_calls + len(calls) < self.max_calls:
                calls.append(call)
        self.num_calls += len(calls)
        content = self._whitespace + content
        kept = content.rstrip()
        self._whitespace = content[len(kept):]
        return kept, calls

    def finish(self) -> tuple[str, list[ToolCall]]:
        """What is left when the output ends: a held-back bare call, or content (held-back or
        unclosed text; without the whitespace around it once a call was made, as in
        ``calls.parse_all``)."""
        if self._bare is not None:
            bare, self._bare = self._bare, None
            match = BARE_CALL.fullmatch(bare)
            call = parse_call(match.group(1), self.tools) if match else None
            if call is not None:
                self.num_calls += 1
                return "", [call]
            content, calls = self.feed(bare)
            rest, more = self.finish()
            return content + rest, calls + more
        rest = self._whitespace + self._buffer
        self._buffer, self._whitespace, self._in_call = "", "", False
        return (rest.strip() if self.num_calls else rest), []


# A whole output that is one JSON object, bare or in a fenced ``json`` block.
BARE_CALL = re.compile(r"\s*(?:```(?:json)?\s*)?(\{.*\})\s*(?:```)?\s*", re.DOTALL)
FENCE = "```json"


def _may_be_bare_call(text: str) -> bool:
    """Whether an output that begins with ``text`` could still be a bare call."""
    head = text.lstrip()
    return not head or head.startswith("{") or head.startswith(FENCE) or FENCE.startswith(head)


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``marker``."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def call_grammar(tools: list[dict[str, Any]], names: list[str], parallel: bool, special_markers: bool) -> str:
    """An llguidance Lark grammar for one call of any of ``names`` (or several, separated by a
    newline, when ``parallel``), each ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``
    with arguments valid against the tool's parameters. ``special_markers``: the tokenizer has
    ``<tool_call>`` / ``</tool_call>`` as single tokens (Qwen2.5); they are then named as tokens, so
    the model writes them as it was trained to, not spelled out byte by byte."""
    by_name = {t["name"]: t for t in tools}
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
