"""A Messages API body -> the chat request it means (the internal form chat itself validates).

Anthropic puts a turn's tool calls and tool results inside its messages as blocks; chat has them
as an assistant message's ``tool_calls`` and as ``tool`` messages. An assistant message becomes
one chat message (its text, its ``tool_use`` blocks as calls, their ``input`` as JSON text); a
user message becomes a ``tool`` message per ``tool_result`` block (results first: they answer the
calls just before), then its text, if any, as a user message. ``system`` is the first message;
a ``system`` message inside ``messages`` stays where it stands (the prompt renderer merges it into
the first one for a chat template that takes a leading system message only).

Claude Code starts ``system`` with a block ``x-anthropic-billing-header: cc_version=...; cch=...;``
whose ``cch`` changes with every request. It means nothing to a local model, and at the very start
of the prompt it would make every request miss the prefix cache, so a leading system block that
starts with ``x-anthropic-billing-header:`` is left out of the prompt (``count_tokens`` too), as
llama.cpp does.
``tool_choice`` maps ``auto``/``none`` as is, ``any`` to ``required``, ``tool`` to a named function,
``disable_parallel_tool_use`` to ``parallel_tool_calls: false``.
"""

from __future__ import annotations

import json
from typing import Any

from server.anthropic.schemas import AnthropicTextBlock, MessagesPrompt, MessagesRequest

BILLING_HEADER = "x-anthropic-billing-header:"


def system_text(blocks: list[AnthropicTextBlock]) -> str:
    """The ``system`` field's text, without Claude Code's billing header (see module docstring)."""
    if blocks and blocks[0].text.startswith(BILLING_HEADER):
        blocks = blocks[1:]
    return "".join(block.text for block in blocks)


def chat_messages(req: MessagesPrompt) -> list[dict[str, Any]]:
    system = system_text(req.system or [])
    out: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    for message in req.messages:
        if message.role == "system":
            out.append({"role": "system", "content": message.text})
            continue
        if message.role == "assistant":
            entry: dict[str, Any] = {"role": "assistant", "content": message.text}
            calls = [{"id": block.id, "type": "function",
                      "function": {"name": block.name, "arguments": json.dumps(block.input, ensure_ascii=False)}}
                     for block in message.content if block.type == "tool_use"]
            if calls:
                entry["tool_calls"] = calls
            out.append(entry)
            continue
        results = [block for block in message.content if block.type == "tool_result"]
        out += [{"role": "tool", "tool_call_id": block.tool_use_id, "content": block.result_text} for block in results]
        if message.text or not results:
            out.append({"role": "user", "content": message.text})
    return out


def prompt_body(req: MessagesPrompt) -> dict[str, Any]:
    """The chat request of the conversation and its tools (all ``count_tokens`` needs)."""
    body: dict[str, Any] = {"model": req.model, "messages": chat_messages(req)}
    if req.tools:
        body["tools"] = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                          "parameters": t.input_schema}} for t in req.tools]
    choice = req.tool_choice
    if choice is not None and (req.tools or choice.type in ("any", "tool")):
        if choice.type == "tool":
            body["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
        else:
            body["tool_choice"] = {"auto": "auto", "none": "none", "any": "required"}[choice.type]
        if req.tools:
            body["parallel_tool_calls"] = not choice.disable_parallel_tool_use
    return body


def chat_body(req: MessagesRequest) -> dict[str, Any]:
    """The chat request with this body's sampling fields and output format."""
    fmt = req.output_config.format if req.output_config is not None else None
    response_format = {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt.json_schema}} if fmt else None
    return {
        **prompt_body(req), "response_format": response_format, "max_tokens": req.max_tokens, "stop": req.stop_sequences,
        "temperature": req.temperature, "top_p": req.top_p, "top_k": req.top_k, "seed": req.seed,
        "speculative": req.speculative, "num_speculative_tokens": req.num_speculative_tokens,
    }
