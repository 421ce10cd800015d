"""How one endpoint's JSON looks: the ``Renderer`` of ``text_completion`` and of ``chat.completion``.

``server.generation.response`` decides *when* a chunk or body is sent (first chunk, deltas, one
finish chunk per choice, the usage chunk); a renderer only says *what* a choice looks like in it.
Keeping the two apart is what lets completions and chat share one streaming path, so a fix to
the stream (error events, usage, ``speculative``) cannot reach one endpoint and miss the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from server.generation.submission import Choice
from server.openai import response_types as rt
from server.openai.bodies import CompletionLogprobs, TokenText, chat_logprobs
from server.tools.calls import CallParser, ToolCall
from server.tools.tool_use import ToolUse
from specdec_core.engine.outputs import TokenLogprob


class Renderer(Protocol):
    """The endpoint-specific shapes; renderers may keep state across a stream's deltas."""

    def object_name(self, *, chunk: bool) -> str:
        """The envelope's ``object`` for a streamed chunk or a whole body."""
        ...

    def opening(self, indices: Sequence[int]) -> Sequence[Sequence[rt.ResponseChoice]]:
        """The choices of each chunk sent before the first delta (one list per chunk)."""
        ...

    def delta(self, index: int, text: str, logprobs: Sequence[TokenLogprob] | None) -> rt.ResponseChoice | None:
        """A streamed choice for one engine delta, or ``None`` when it carries nothing to send."""
        ...

    def finish(self, index: int, finish_reason: str | None) -> rt.ResponseChoice:
        """The streamed choice that ends choice ``index``."""
        ...

    def choice(self, choice: Choice) -> rt.ResponseChoice:
        """A finished choice in a non-streamed body."""
        ...


def completion_choice(index: int, text: str, finish_reason: str | None, logprobs: rt.CompletionLogprobs | None) -> rt.CompletionChoice:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}


@dataclass
class CompletionRenderer:
    """``/v1/completions``: ``text_completion`` objects, legacy logprobs, optional ``echo``.

    ``echoes`` maps a choice index to its echoed prompt; a stream sends each echo as a chunk of its
    own before any delta, and logprobs ``text_offset`` counts from the start of the echo.
    """

    token_text: TokenText
    logprobs: bool
    echoes: dict[int, str] = field(default_factory=dict)
    # One incremental builder per streamed choice: text_offset continues across chunks.
    _builders: dict[int, CompletionLogprobs] = field(default_factory=dict, init=False, repr=False)

    def object_name(self, *, chunk: bool) -> str:
        return "text_completion"

    def opening(self, indices: Sequence[int]) -> list[list[rt.CompletionChoice]]:
        return [[completion_choice(index, prefix, None, None)] for index, prefix in sorted(self.echoes.items())]

    def delta(self, index: int, text: str, logprobs: Sequence[TokenLogprob] | None) -> rt.CompletionChoice | None:
        piece = None
        if self.logprobs and logprobs:
            builder = self._builders.get(index)
            if builder is None:
                builder = self._builders[index] = CompletionLogprobs(self.token_text, len(self.echoes.get(index, "")))
            piece = builder.piece(logprobs)
        if not text and piece is None:
            return None
        return completion_choice(index, text, None, piece)

    def finish(self, index: int, finish_reason: str | None) -> rt.CompletionChoice:
        return completion_choice(index, "", finish_reason, None)

    def choice(self, choice: Choice) -> rt.CompletionChoice:
        prefix = self.echoes.get(choice.index, "")
        logprobs = None
        if self.logprobs:
            logprobs = CompletionLogprobs(self.token_text, len(prefix)).piece(choice.logprobs)
        return completion_choice(choice.index, prefix + "".join(choice.text), choice.finish_reason, logprobs)


def chat_chunk_choice(
    index: int, delta: rt.ChatDelta, finish_reason: str | None = None, logprobs: rt.ChatLogprobs | None = None
) -> rt.ChatChunkChoice:
    return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}


@dataclass
class ChatRenderer:
    """``/v1/chat/completions``: ``chat.completion`` bodies, ``chat.completion.chunk`` deltas.

    A stream opens with one chunk giving every choice its ``assistant`` role, as OpenAI does.
    With ``tools`` (the request's ``ToolUse`` when it offers any), tool calls are parsed out of
    the text: content streams as it arrives, each call is sent as a ``delta.tool_calls`` entry
    once its block is complete, and a choice that called a tool ends with ``finish_reason:
    "tool_calls"``. With tools the opening ``content`` is null, so a stream that only calls tools
    assembles into the message a non-streamed answer gives (``content: null``), as with OpenAI.
    """

    token_text: TokenText
    logprobs: bool
    tools: ToolUse | None = None
    _parsers: dict[int, CallParser] = field(default_factory=dict, init=False, repr=False)

    def object_name(self, *, chunk: bool) -> str:
        return "chat.completion.chunk" if chunk else "chat.completion"

    def opening(self, indices: Sequence[int]) -> list[list[rt.ChatChunkChoice]]:
        content = None if self.tools else ""
        return [[chat_chunk_choice(index, {"role": "assistant", "content": content}) for index in indices]]

    def delta(self, index: int, text: str, logprobs: Sequence[TokenLogprob] | None) -> rt.ChatChunkChoice | None:
        piece = chat_logprobs(self.token_text, logprobs) if self.logprobs and logprobs else None
        delta: rt.ChatDelta = {"content": text}
        if self.tools:
            parser = self._parser(index)
            first = parser.num_calls
            content, calls = parser.feed(text)
            delta = {"content": content} if content or not calls else {}
            if calls:
                delta["tool_calls"] = _numbered(calls, first)
        if not delta.get("content") and "tool_calls" not in delta and piece is None:
            return None
        return chat_chunk_choice(index, delta, None, piece)

    def finish(self, index: int, finish_reason: str | None) -> rt.ChatChunkChoice:
        if not self.tools:
            return chat_chunk_choice(index, {}, finish_reason)
        parser = self._parser(index)
        first = parser.num_calls
        rest, calls = parser.finish()  # a held-back bare call, or content after all
        delta: rt.ChatDelta = {"content": rest} if rest else {}
        if calls:
            delta["tool_calls"] = _numbered(calls, first)
        return chat_chunk_choice(index, delta, _finish_reason(finish_reason, parser.num_calls))

    def choice(self, choice: Choice) -> rt.ChatChoice:
        logprobs = chat_logprobs(self.token_text, choice.logprobs) if self.logprobs else None
        text = "".join(choice.text)
        message: rt.ChatMessage = {"role": "assistant", "content": text}
        calls: list[ToolCall] = []
        if self.tools:
            message["content"], calls = self.tools.parse(text)
            if calls:
                message["tool_calls"] = [call.to_openai() for call in calls]
        return {
            "index": choice.index,
            "message": message,
            "logprobs": logprobs,
            "finish_reason": _finish_reason(choice.finish_reason, len(calls)),
        }

    def _parser(self, index: int) -> CallParser:
        assert self.tools is not None
        if index not in self._parsers:
            self._parsers[index] = self.tools.parser()
        return self._parsers[index]


def _numbered(calls: list[ToolCall], first: int) -> list[rt.ToolCall]:
    """A delta's ``tool_calls``; calls are numbered across the whole choice."""
    return [call.to_openai(first + i) for i, call in enumerate(calls)]


def _finish_reason(engine_reason: str | None, num_calls: int) -> str | None:
    """OpenAI's ``tool_calls`` when a choice that called a tool ended by itself."""
    return "tool_calls" if num_calls and engine_reason == "stop" else engine_reason
