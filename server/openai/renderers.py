"""How one endpoint's JSON looks: the ``Renderer`` of ``text_completion`` and of ``chat.completion``.

``server.openai.choices_response`` decides *when* a chunk or body is sent (first chunk, deltas, one
finish chunk per choice, the usage chunk); a renderer only says *what* a choice looks like in it.
Keeping the two apart is what lets completions and chat share one streaming path, so a fix to
the stream (error events, usage, ``speculative``) cannot reach one endpoint and miss the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from server.api import response_types as rt
from server.generation.submission import Choice
from server.openai.bodies import CompletionLogprobs, TokenText, chat_logprobs, prompt_logprobs
from server.tools.calls import CallDelta, CallParser, ToolCall
from server.tools.tool_use import ToolUse
from specdec_core.decoding.token_logprob import TokenLogprob
from specdec_core.engine.provenance import TextPiece


class Renderer(Protocol):
    """The endpoint-specific shapes; renderers may keep state across a stream's deltas."""

    def object_name(self, *, chunk: bool) -> str:
        """The envelope's ``object`` for a streamed chunk or a whole body."""
        ...

    def opening(self, indices: Sequence[int]) -> Sequence[Sequence[rt.ResponseChoice]]:
        """The choices of each chunk sent before the first delta (one list per chunk)."""
        ...

    def delta(
        self, index: int, text: str, logprobs: Sequence[TokenLogprob] | None, provenance: Sequence[TextPiece] | None = None
    ) -> Sequence[rt.ResponseChoice]:
        """The streamed choices (one chunk each) for one engine delta; none when it carries nothing.
        ``provenance`` (the delta's text by source, when the request asked for it) rides on the
        first of them."""
        ...

    def finish(self, index: int, finish_reason: str | None) -> Sequence[rt.ResponseChoice]:
        """The streamed choices that end choice ``index``; the last one carries its finish reason."""
        ...

    def choice(self, choice: Choice) -> rt.ResponseChoice:
        """A finished choice in a non-streamed body."""
        ...

    def body_fields(self, choices: Sequence[Choice]) -> dict[str, Any]:
        """Fields a non-streamed body carries beside its choices (chat's ``prompt_logprobs``)."""
        ...


def provenance_pieces(pieces: Sequence[TextPiece]) -> list[rt.ProvenancePiece]:
    """The ``provenance`` extension of a streamed choice: its text, piece by piece, by source."""
    return [{"text": p.text, "source": p.source} for p in pieces]


def completion_choice(index: int, text: str, finish_reason: str | None, logprobs: rt.CompletionLogprobs | None) -> rt.CompletionChoice:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}


@dataclass
class CompletionRenderer:
    """``/v1/completions``: ``text_completion`` objects, legacy logprobs, optional ``echo``.

    ``echoes`` maps a choice index to its echoed prompt; a stream sends each echo as a chunk of its
    own before any delta, and logprobs ``text_offset`` counts from the start of the echo. With
    ``echo_logprobs`` (``echo`` and ``logprobs`` together, never streamed) the prompt's tokens lead
    the ``logprobs`` object, that many alternatives each. ``prompt_logprobs``: vLLM's per-choice
    field, that many alternatives.
    """

    token_text: TokenText
    logprobs: bool
    echoes: dict[int, str] = field(default_factory=dict)
    echo_logprobs: int | None = None
    prompt_logprobs: int | None = None
    # One incremental builder per streamed choice: text_offset continues across chunks.
    _builders: dict[int, CompletionLogprobs] = field(default_factory=dict, init=False, repr=False)

    def object_name(self, *, chunk: bool) -> str:
        return "text_completion"

    def opening(self, indices: Sequence[int]) -> list[list[rt.CompletionChoice]]:
        return [[completion_choice(index, prefix, None, None)] for index, prefix in sorted(self.echoes.items())]

    def delta(
        self, index: int, text: str, logprobs: Sequence[TokenLogprob] | None, provenance: Sequence[TextPiece] | None = None
    ) -> list[rt.CompletionChoice]:
        piece = None
        if self.logprobs and logprobs:
            builder = self._builders.get(index)
            if builder is None:
                builder = self._builders[index] = CompletionLogprobs(self.token_text, len(self.echoes.get(index, "")))
            piece = builder.piece(logprobs)
        if not text and piece is None:
            return []
        chunk = completion_choice(index, text, None, piece)
        if provenance:
            chunk["provenance"] = provenance_pieces(provenance)
        return [chunk]

    def finish(self, index: int, finish_reason: str | None) -> list[rt.CompletionChoice]:
        return [completion_choice(index, "", finish_reason, None)]

    def choice(self, choice: Choice) -> rt.CompletionChoice:
        prefix = self.echoes.get(choice.index, "")
        logprobs = None
        if self.logprobs:
            logprobs = CompletionLogprobs(self.token_text, len(prefix)).piece(choice.logprobs)
        if logprobs is not None and self.echo_logprobs is not None and choice.prompt_logprobs is not None:
            echoed = CompletionLogprobs(self.token_text).prompt_piece(choice.prompt_ids, choice.prompt_logprobs,
                                                                     self.echo_logprobs)
            logprobs = CompletionLogprobs.join(echoed, logprobs)
        body = completion_choice(choice.index, prefix + "".join(choice.text), choice.finish_reason, logprobs)
        if self.prompt_logprobs is not None and choice.prompt_logprobs is not None:
            body["prompt_logprobs"] = prompt_logprobs(self.token_text, choice.prompt_logprobs, self.prompt_logprobs)
        return body

    def body_fields(self, choices: Sequence[Choice]) -> dict[str, Any]:
        return {}


def chat_chunk_choice(
    index: int, delta: rt.ChatDelta, finish_reason: str | None = None, logprobs: rt.ChatLogprobs | None = None
) -> rt.ChatChunkChoice:
    return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}


@dataclass
class ChatRenderer:
    """``/v1/chat/completions``: ``chat.completion`` bodies, ``chat.completion.chunk`` deltas.

    A stream opens with one chunk giving every choice its ``assistant`` role, as OpenAI does.
    With ``tools`` (the request's ``ToolUse`` when it offers any), tool calls are parsed out of
    the text (``server.tools``): content streams as it arrives, each call as OpenAI streams one (a
    chunk with its id and name, then chunks of ``arguments`` text as the model writes them), and a
    choice that called a tool and ended by itself ends with ``finish_reason: "tool_calls"``. With
    tools the opening ``content`` is null, so a stream that only calls tools assembles into the
    message a non-streamed answer gives (``content: null``), as with OpenAI.
    """

    token_text: TokenText
    logprobs: bool
    tools: ToolUse | None = None
    prompt_logprobs: int | None = None  # vLLM's field, on the body: the prompt every choice shares
    _parsers: dict[int, CallParser] = field(default_factory=dict, init=False, repr=False)

    def object_name(self, *, chunk: bool) -> str:
        return "chat.completion.chunk" if chunk else "chat.completion"

    def opening(self, indices: Sequence[int]) -> list[list[rt.ChatChunkChoice]]:
        content = None if self.tools else ""
        return [[chat_chunk_choice(index, {"role": "assistant", "content": content}) for index in indices]]

    def delta(
        self, index: int, text: str, logprobs: Sequence[TokenLogprob] | None, provenance: Sequence[TextPiece] | None = None
    ) -> list[rt.ChatChunkChoice]:
        piece = chat_logprobs(self.token_text, logprobs) if self.logprobs and logprobs else None
        if not self.tools:
            chunks = [chat_chunk_choice(index, {"content": text}, None, piece)] if text or piece is not None else []
        else:
            content, calls = self._parser(index).feed(text)
            chunks = _call_chunks(index, content, calls)
            if piece is not None:  # the tokens' logprobs ride on the first chunk they produced
                if not chunks:
                    chunks = [chat_chunk_choice(index, {"content": ""})]
                chunks[0]["logprobs"] = piece
        if provenance:  # likewise the text's sources (with tools: the call markup's too)
            if not chunks:
                chunks = [chat_chunk_choice(index, {"content": ""})]
            chunks[0]["provenance"] = provenance_pieces(provenance)
        return chunks

    def finish(self, index: int, finish_reason: str | None) -> list[rt.ChatChunkChoice]:
        if not self.tools:
            return [chat_chunk_choice(index, {}, finish_reason)]
        parser = self._parser(index)
        rest, calls = parser.finish()  # a held-back bare call, the rest of a cut call, or content
        return [*_call_chunks(index, rest, calls),
                chat_chunk_choice(index, {}, _finish_reason(finish_reason, parser.num_calls))]

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

    def body_fields(self, choices: Sequence[Choice]) -> dict[str, Any]:
        given = next((c.prompt_logprobs for c in choices if c.prompt_logprobs is not None), None)
        if self.prompt_logprobs is None or given is None:
            return {}
        return {"prompt_logprobs": prompt_logprobs(self.token_text, given, self.prompt_logprobs)}

    def _parser(self, index: int) -> CallParser:
        assert self.tools is not None
        if index not in self._parsers:
            self._parsers[index] = self.tools.parser()
        return self._parsers[index]


def _call_chunks(index: int, content: str, calls: list[CallDelta]) -> list[rt.ChatChunkChoice]:
    """The chunks of one parsed delta: its content, then each call's first piece in a chunk of its
    own (name, ``arguments: ""``, as OpenAI streams it) and its argument text in the next."""
    chunks = [chat_chunk_choice(index, {"content": content})] if content else []
    entries: list[rt.ToolCallDelta] = []
    for call in calls:
        if call.name is None and entries and "id" not in entries[-1] and entries[-1]["index"] == call.index:
            entries[-1]["function"]["arguments"] = entries[-1]["function"].get("arguments", "") + call.arguments
            continue
        entries.append(call.to_openai())
    chunks += [chat_chunk_choice(index, {"tool_calls": [entry]}) for entry in entries]
    return chunks


def _finish_reason(engine_reason: str | None, num_calls: int) -> str | None:
    """OpenAI's ``tool_calls`` when a choice that called a tool ended by itself."""
    return "tool_calls" if num_calls and engine_reason == "stop" else engine_reason
