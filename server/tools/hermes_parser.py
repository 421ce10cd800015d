"""Hermes / Qwen2.5 call syntax -> content and streamed call pieces (see ``server.tools.hermes``).

Rules, the same for every ``tool_choice`` and for streamed and whole answers (a whole answer is
this parser run over its text at once, ``server.generation.output_items.assemble``):

- Call syntax never reaches ``content``. Text inside a ``<tool_call>`` block becomes a call or is
  dropped: a block naming a declared function is that call; anything else (an undeclared name, a
  block that names nothing) is dropped, as OpenAI never answers call syntax as text.
- A call streams as OpenAI streams one: a first piece with its id and name (``arguments: ""``) as
  soon as ``{"name": "...", "arguments": `` is complete, then the arguments object's text as the
  model writes it (a ``<`` outside a string, which no JSON holds, ends a broken object).
  The arguments are the model's own text (whitespace included), not re-serialised, so streamed
  pieces and the whole answer agree byte for byte. A block written in another shape (arguments
  as a JSON string, keys in another order) is parsed when it closes and sent whole, re-serialised,
  or dropped if it is not a call.
- A block cut off by the end of the output (``max_tokens``, a stop string), or a bare JSON call
  (below) cut off, is returned as the call it started, with the partial ``arguments`` text written so far (OpenAI does the same with
  ``finish_reason: "length"``); one whose name was not complete yet is dropped.
- An exact repeat of a call already made in this answer (same name, same arguments text) ends
  the answer (``ended``): small models asked for ``"required"`` calls with parallel calls allowed
  repeat one call until ``max_tokens``. Nothing about the tokens changes: the generation is only
  stopped there, as a stop string stops it. While a call may still turn out to be a repeat (its
  name and arguments so far match an earlier call's) its pieces are held back; a repeat, or a cut
  call that was still a prefix of an earlier one, is never sent.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from server.http.jsonio import loads_bounded
from server.tools.calls import CallDelta, ToolCall, new_call_id

OPEN, CLOSE = "<tool_call>", "</tool_call>"
NAME = re.compile(r'\s*\{\s*"name"\s*:\s*"([A-Za-z0-9_.-]{1,64})"')
ARGUMENTS = re.compile(r'\s*,\s*"(?:arguments|parameters)"\s*:\s*(?=\{)')
# A whole output that is one JSON object, bare or in a fenced ``json`` block.
BARE_CALL = re.compile(r"\s*(?:```(?:json)?\s*)?(\{.*\})\s*(?:```)?\s*", re.DOTALL)
FENCE = "```json"


def parse_call(body: str, tools: set[str]) -> ToolCall | None:
    """The call in a whole block's text, or None when it is not a call of a declared tool (bounded
    parse: a grammar can make the model nest thousands of levels). Arguments re-serialised: used
    only where the model's text is not already ``{"name": ..., "arguments": {...}}``."""
    try:
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


@dataclass
class _Block:
    """An open ``<tool_call>`` block: its text so far and how far the arguments were read."""

    text: str = ""
    name: str | None = None
    name_end: int = 0
    args_start: int | None = None
    args_end: int | None = None  # set once the arguments object is complete
    scanned: int = 0
    searched: int = 0  # the closing tag is not in text[:searched]
    depth: int = 0
    in_string: bool = False
    escaped: bool = False
    index: int | None = None  # set once the call was sent (its first piece)
    sent: int = 0  # arguments characters sent
    dropped: bool = False
    id: str = ""

    @property
    def arguments(self) -> str:
        if self.args_start is None:
            return ""
        return self.text[self.args_start: self.args_end if self.args_end is not None else self.scanned]

    def scan(self) -> None:
        """Follow the arguments object's brackets and strings to where it ends (or to a ``<``
        outside a string, which no JSON holds: a broken object ends there)."""
        assert self.args_start is not None
        text, i = self.text, max(self.scanned, self.args_start)
        while i < len(text) and self.args_end is None:
            ch = text[i]
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.in_string = False
            elif ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.args_end = i + 1
            elif ch == "<":
                self.args_end = i
                break
            i += 1
        self.scanned = i


class ToolCallParser:
    """Splits streamed text into content and call pieces (rules in the module docstring).

    Content streams as it arrives, except a tail that may be the start of ``<tool_call>`` and
    trailing whitespace (the newlines around calls are not content).

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
        self._block: _Block | None = None
        self._bare: str | None = ""  # the output so far while it may be a bare call; None once not
        self._made: list[tuple[str, str]] = []  # (name, arguments) of the calls completed so far
        self.num_calls = 0
        self.ended = False

    def feed(self, text: str) -> tuple[str, list[CallDelta]]:
        if self.ended:
            return "", []
        if self._bare is not None:
            self._bare += text
            if _may_be_bare_call(self._bare):
                return "", []
            text, self._bare = self._bare, None
        self._buffer += text
        content, deltas = "", list[CallDelta]()
        while not self.ended:
            if self._block is None:
                start = self._buffer.find(OPEN)
                if start < 0:
                    keep = _partial_suffix(self._buffer, OPEN)
                    content += self._buffer[: len(self._buffer) - keep]
                    self._buffer = self._buffer[len(self._buffer) - keep:]
                    break
                content += self._buffer[:start]
                self._block, self._buffer = _Block(), self._buffer[start + len(OPEN):]
            block = self._block
            block.text += self._buffer
            self._buffer = ""
            self._advance(block, deltas)
            end = self._close_at(block)
            if end < 0 or self.ended:
                break
            self._buffer = block.text[end + len(CLOSE):]
            block.text = block.text[:end]
            self._complete(block, deltas)
            self._block = None
        if self.ended:
            self._buffer, self._block = "", None
        content = self._whitespace + content
        kept = content.rstrip()
        self._whitespace = content[len(kept):]
        return kept, deltas

    def finish(self) -> tuple[str, list[CallDelta]]:
        """What is left when the output ends: a held-back bare call, the rest of a cut call, or
        content (held-back text; without the whitespace around it once a call was made, as a
        whole answer's message has it). A cut-off ``<tool_call`` tag is not content either."""
        if self.ended:
            return "", []
        if self._bare is not None:
            bare, self._bare = self._bare, None
            match = BARE_CALL.fullmatch(bare)
            call = parse_call(match.group(1), self.tools) if match else None
            if call is not None:
                deltas: list[CallDelta] = []
                self._send_whole(call.name, call.arguments, deltas)
                return "", deltas
            cut = _cut_bare_call(bare, self.tools)
            # A bare call cut short is call syntax too: parsed as the block it would have been.
            content, deltas = self.feed(bare if cut is None else OPEN + cut)
            rest, more = self.finish()
            return content + rest, deltas + more
        deltas = []
        block, self._block = self._block, None
        if block is not None and block.index is None and not block.dropped and block.name is not None:
            if not self._repeat_prefix(block.name, block.arguments):  # else: the cut start of a repeat
                self._start(block, deltas)
                self._send_arguments(block, deltas)
        rest = self._whitespace + (self._buffer if len(self._buffer) < 2 else "")
        self._buffer, self._whitespace = "", ""
        return (rest.strip() if self.num_calls else rest), deltas

    # -- one block ------------------------------------------------------------------------------
    def _advance(self, block: _Block, deltas: list[CallDelta]) -> None:
        """Read the name and the arguments as far as they have arrived; send what is certain."""
        if block.name is None and not block.dropped:
            match = NAME.match(block.text)
            if match is None:
                return
            block.name, block.name_end = match.group(1), match.end()
            if block.name not in self.tools:
                block.dropped = True
        if block.dropped or block.name is None:
            return
        if block.args_start is None:
            match = ARGUMENTS.match(block.text, block.name_end)
            if match is None:
                return
            block.args_start = match.end()
        block.scan()
        if block.index is None:
            if self._repeat_prefix(block.name, block.arguments):
                if block.args_end is not None and (block.name, block.arguments) in self._made:
                    self.ended = True  # an exact repeat: the answer is complete
                return
            if not self._start(block, deltas):
                return
        self._send_arguments(block, deltas)

    def _close_at(self, block: _Block) -> int:
        """Where the block's closing tag starts, or -1. Inside an arguments object still being
        written a ``</tool_call>`` is string content, not the end. Each feed searches only the
        text not searched before (a long block must not cost quadratic time)."""
        if block.args_start is not None and block.args_end is None and not block.dropped:
            return -1
        end = block.text.find(CLOSE, max(block.args_end or 0, block.searched))
        if end < 0:
            block.searched = max(len(block.text) - len(CLOSE) + 1, 0)
        return end

    def _complete(self, block: _Block, deltas: list[CallDelta]) -> None:
        """The block closed: a call in another shape is parsed whole now; remember the call."""
        if block.dropped:
            return
        if block.args_start is None:  # not {"name": ..., "arguments": {...}}: parse the whole block
            call = parse_call(block.text, self.tools)
            if call is not None and (call.name, call.arguments) in self._made:
                self.ended = True
            elif call is not None:
                self._send_whole(call.name, call.arguments, deltas, block)
            return
        if block.index is not None:
            self._made.append((block.name or "", block.arguments))

    # -- sending ----------------------------------------------------------------------------------
    def _repeat_prefix(self, name: str, arguments: str) -> bool:
        """Whether a call so far could still be an exact repeat of one made before."""
        return any(name == n and a.startswith(arguments) for n, a in self._made)

    def _start(self, block: _Block, deltas: list[CallDelta]) -> bool:
        """Send a call's first piece (its id and name), unless calls are capped; False if dropped."""
        if self.max_calls is not None and self.num_calls >= self.max_calls:
            block.dropped = True
            return False
        block.index, block.id = self.num_calls, new_call_id()
        self.num_calls += 1
        deltas.append(CallDelta(block.index, "", block.name, block.id))
        return True

    def _send_arguments(self, block: _Block, deltas: list[CallDelta]) -> None:
        """Send the arguments text written since the last piece (sliced, not rebuilt: linear time)."""
        if block.index is None or block.args_start is None:
            return
        end = block.args_end if block.args_end is not None else block.scanned
        if end > block.args_start + block.sent:
            deltas.append(CallDelta(block.index, block.text[block.args_start + block.sent: end]))
            block.sent = end - block.args_start

    def _send_whole(self, name: str, arguments: str, deltas: list[CallDelta], block: _Block | None = None) -> None:
        block = block or _Block()
        block.name = name
        if self._start(block, deltas):
            assert block.index is not None
            deltas.append(CallDelta(block.index, arguments))
            self._made.append((name, arguments))


def _cut_bare_call(text: str, tools: set[str]) -> str | None:
    """The JSON of an output that is the unfinished start of a bare call of a declared tool
    (``{"name": "get_time", "arguments": {"ci``, fenced or not), else None."""
    head = text.lstrip()
    head = head[len(FENCE):] if head.startswith(FENCE) else head
    name = NAME.match(head)
    if name is None or name.group(1) not in tools or ARGUMENTS.match(head, name.end()) is None:
        return None
    try:
        json.JSONDecoder().raw_decode(head.lstrip())
    except ValueError:
        return head  # not a whole JSON value: cut short
    return None


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
