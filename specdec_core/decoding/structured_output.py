"""Structured output: what a request's text must match (a JSON schema, any JSON object, or a
grammar), as the engine receives it in ``SamplingParams.structured``.

The engine compiles the spec with llguidance and masks both the draft's and the target's
distributions with it, so speculation stays lossless with respect to the *constrained* target.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StructuredOutput:
    """Exactly one of the fields is set.

    ``json_schema``: the output is one JSON value valid against the schema (OpenAI's strict
    ``json_schema`` response format). ``json_object``: any JSON object (``{"type": "json_object"}``).
    ``lark``: an llguidance Lark grammar, which may embed JSON schemas as ``%json{...}`` and name
    special tokens as ``<tool_call>`` (tool calls use this).
    """

    json_schema: dict[str, Any] | None = None
    json_object: bool = False
    lark: str | None = None

    def __post_init__(self) -> None:
        given = sum([self.json_schema is not None, self.json_object, self.lark is not None])
        if given != 1:
            raise ValueError("structured output needs exactly one of json_schema, json_object, lark")

    @functools.cached_property
    def cache_key(self) -> str:
        """The compiled-grammar cache key: a hash of the spec's text, computed once per spec (every
        choice of a request shares one spec). The old key, ``json.dumps(sort_keys=True)`` per
        choice on the event loop, stalled /health 5.5 s for a 1 MB schema with n=128."""
        text = json.dumps([self.json_schema, self.json_object, self.lark], ensure_ascii=False)
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
