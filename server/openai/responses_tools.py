"""The Responses API's tools as the functions the model is offered, and its calls back as the
items each tool type answers with.

Agents send more than ``function`` tools (Codex CLI sends all of these on its first request):

- ``function``: offered as it is; a call is a ``function_call`` item.
- ``namespace``: a group of function (or custom) tools, Codex's MCP servers and sub-agent tools.
  Each is offered as a function whose name joins the namespace and the tool's name
  (``mcp__github__`` + ``search`` -> ``mcp__github__search``, ``multi_agent_v1`` + ``spawn`` ->
  ``multi_agent_v1.spawn``); a call comes back split again, ``namespace`` and ``name``, which is
  how the client routes it.
- ``custom``: a tool that takes free text (``format`` text) or text in a grammar (``format``
  grammar, Lark or regex), such as Codex's ``apply_patch``. The model is offered a function with one
  string argument, ``input``, whose description carries the grammar; its call comes back as a
  ``custom_tool_call`` item whose ``input`` is that string.
- any other type (``web_search``, ``file_search``, ``image_generation``, ``code_interpreter``,
  ``computer_use``, ``mcp``, ``tool_search`` ...): a tool the provider would run, which this server
  cannot. It is left out of the prompt and named in a warning, as llama.cpp does, never a 400
  (an agent sends them with every request).

Past calls sent back as input items (``function_call`` with ``namespace``, ``custom_tool_call``)
are mapped to the same function names, so a conversation renders the prompt the model saw.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Literal

from server.http.jsonio import loads_bounded

MAX_NAME = 64  # chat's (OpenAI's) longest function name
# Joining a namespace and a name: a namespace that ends in a separator is joined as it is.
SEPARATORS = ("_", ".", "-")


@dataclass(frozen=True)
class ServedTool:
    """One tool the model is offered: ``function`` is the name it calls it by."""

    kind: Literal["function", "custom"]
    name: str
    namespace: str | None
    function: str
    description: str | None
    parameters: dict[str, Any] | None


def custom_parameters(fmt: Any) -> dict[str, Any]:
    """The one-argument schema a custom tool is offered with (``fmt``: its ``CustomToolFormat``,
    None for free text; a grammar goes into the argument's description)."""
    described = "The tool's whole input, as free text."
    if fmt is not None and fmt.type == "grammar":
        described = f"The tool's whole input. It must match this {fmt.syntax} grammar:\n{fmt.definition}"
    return {"type": "object", "properties": {"input": {"type": "string", "description": described}},
            "required": ["input"], "additionalProperties": False}


def joined_name(namespace: str | None, name: str) -> str:
    if not namespace:
        return name
    joined = namespace + name if namespace.endswith(SEPARATORS) else f"{namespace}.{name}"
    if len(joined) <= MAX_NAME:
        return joined
    digest = hashlib.blake2b(joined.encode(), digest_size=4).hexdigest()
    return f"{joined[:MAX_NAME - 9]}_{digest}"


@dataclass
class ResponsesTools:
    """The tools of one request (see module docstring): what is offered, and what is left out."""

    served: list[ServedTool]
    left_out: list[str]  # the types of the tools this server cannot run

    @classmethod
    def of(cls, tools: list[Any]) -> ResponsesTools:
        served: list[ServedTool] = []
        left_out: list[str] = []
        for tool in tools:
            if tool.type == "namespace":
                served += [_served(inner, tool.name) for inner in tool.tools]
            elif tool.type in ("function", "custom"):
                served.append(_served(tool, None))
            else:
                left_out.append(tool.type)
        return cls(served, left_out)

    def chat_tools(self) -> list[dict[str, Any]]:
        """Chat's ``tools`` for the served ones."""
        return [{"type": "function", "function": {
            "name": t.function, "parameters": t.parameters,
            **({"description": t.description} if t.description is not None else {})}} for t in self.served]

    def by_function(self, function: str) -> ServedTool | None:
        return next((t for t in self.served if t.function == function), None)


def _served(tool: Any, namespace: str | None) -> ServedTool:
    function = joined_name(namespace, tool.name)
    if tool.type == "custom":
        return ServedTool("custom", tool.name, namespace, function, tool.description, custom_parameters(tool.format))
    return ServedTool("function", tool.name, namespace, function, tool.description, tool.parameters)


def custom_input(arguments: str) -> str:
    """A custom tool's input from the arguments of the function it was offered as (the raw text
    when the model wrote no ``input`` string: a call cut short)."""
    try:
        value = loads_bounded(arguments)
    except ValueError:
        return arguments
    return value["input"] if isinstance(value, dict) and isinstance(value.get("input"), str) else arguments


def custom_arguments(text: str) -> str:
    """A past custom call's ``input`` as the arguments of its function (the inverse of ``custom_input``)."""
    return json.dumps({"input": text}, ensure_ascii=False)
