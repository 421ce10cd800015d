"""How one endpoint's JSON looks: the ``Renderer`` of ``text_completion`` and of ``chat.completion``.

``server.openai.choices_response`` decides *when* a chunk or body is sent (first chunk, updates,
the usage chunk); a renderer only says *what* a choice looks like in it. Keeping the two apart is
what lets completions and chat share one streaming path, so a fix to the stream (error events,
usage, ``speculative``) cannot reach one endpoint and miss the other. Both render the output items
every API renders (``server.generation.answer``): text items are the content, call items chat's
``tool_calls``, so tool calls are parsed and streamed by one builder for all four APIs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from server.api import response_types as rt
from server.generation.answer import ChoiceUpdate
from server.generation.output_items import assemble
from server.generation.submission import Choice
from server.openai.bodies import CompletionLogprobs, TokenText, chat_logprobs, prompt_logprobs
from server.tools.tool_use import ToolUse
from specdec_core.engine.provenance import TextPiece


class Renderer(Protocol):
    """The endpoint-specific shapes; renderers may keep state across a stream's updates."""

    @property
    def tools(self) -> ToolUse | None:
        """The tools the request offers (None: none), whose calls the answer's items hold."""
        ...

    def object_name(self, *, chunk: bool) -> str:
        """The envelope's ``object`` for a streamed chunk or a whole body."""
        ...

    def opening(self, indices: Sequence[int]) -> Sequence[Sequence[rt.ResponseChoice]]:
        """The choices of each chunk sent before the first update (one list per chunk)."""
        ...

    def update(self, update: ChoiceUpdate) -> Sequence[rt.ResponseChoice]:
        """The streamed choices (one chunk each) for one update; none when it carries nothing. The
        delta's logprobs and provenance ride on the first; a finished choice's last one carries its
        finish reason."""
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
    tools: None = None  # completions offer no tools: the answer is one text item, the model's text
    # One incremental builder per streamed choice: text_offset continues across chunks.
    _builders: dict[int, CompletionLogprobs] = field(default_factory=dict, init=False, repr=False)

    def object_name(self, *, chunk: bool) -> str:
        return "text_completion"

    def opening(self, indices: Sequence[int]) -> list[list[rt.CompletionChoice]]:
        return [[completion_choice(index, prefix, None, None)] for index, prefix in sorted(self.echoes.items())]

    def update(self, update: ChoiceUpdate) -> list[rt.CompletionChoice]:
        index, out = update.choice.index, update.output
        piece = None
        if self.logprobs and out.logprobs:
            builder = self._builders.get(index)
            if builder is None:
                builder = self._builders[index] = CompletionLogprobs(self.token_text, len(self.echoes.get(index, "")))
            piece = builder.piece(out.logprobs)
        text = update.text
        chunks = [completion_choice(index, text, None, piece)] if text or piece is not None else []
        if out.provenance:
            if not chunks:
                chunks = [completion_choice(index, "", None, None)]
            chunks[0]["provenance"] = provenance_pieces(out.provenance)
        if update.finished:
            chunks.append(completion_choice(index, "", update.choice.finish_reason, None))
        return chunks

    def choice(self, choice: Choice) -> rt.CompletionChoice:
        prefix = self.echoes.get(choice.index, "")
        logprobs = None
        if self.logprobs:
            logprobs = CompletionLogprobs(self.token_text, len(prefix)).piece(choice.logprobs)
        if logprobs is not None and self.echo_logprobs is not None and choice.prompt_logprobs is not None:
            echoed = CompletionLogprobs(self.token_text).prompt_piece(choice.prompt_ids, choice.prompt_logprobs,
                                                                     self.echo_logprobs)
            logprobs = CompletionLogprobs.join(echoed, logprobs)
        text = assemble(None, "".join(choice.text)).message()[0] or ""
        body = completion_choice(choice.index, prefix + text, choice.finish_reason, logprobs)
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
    With ``tools`` (the request's ``ToolUse`` when it offers any), the answer's text items are its
    content and its call items its ``tool_calls``: content streams as it arrives, each call as
    OpenAI streams one (a chunk with its id and name and ``arguments: ""``, then chunks of
    ``arguments`` text as the model writes them), and a choice that called a tool and ended by
    itself ends with ``finish_reason: "tool_calls"``. With tools the opening ``content`` is null,
    so a stream that only calls tools assembles into the message a non-streamed answer gives
    (``content: null``), as with OpenAI.
    """

    token_text: TokenText
    logprobs: bool
    tools: ToolUse | None = None
    prompt_logprobs: int | None = None  # vLLM's field, on the body: the prompt every choice shares

    def object_name(self, *, chunk: bool) -> str:
        return "chat.completion.chunk" if chunk else "chat.completion"

    def opening(self, indices: Sequence[int]) -> list[list[rt.ChatChunkChoice]]:
        content = None if self.tools else ""
        return [[chat_chunk_choice(index, {"role": "assistant", "content": content}) for index in indices]]

    def update(self, update: ChoiceUpdate) -> list[rt.ChatChunkChoice]:
        index, out = update.choice.index, update.output
        chunks = _item_chunks(update)
        piece = chat_logprobs(self.token_text, out.logprobs) if self.logprobs and out.logprobs else None
        if piece is not None or out.provenance:  # they ride on the delta's first chunk (one of its own if
            if not chunks:                        # the parser held its text back, as call markup)
                chunks = [chat_chunk_choice(index, {"content": ""})]
            chunks[0]["logprobs"] = piece
            if out.provenance:
                chunks[0]["provenance"] = provenance_pieces(out.provenance)
        if update.finished:
            chunks.append(chat_chunk_choice(index, {}, _finish_reason(update.choice.finish_reason, update.items.num_calls)))
        return chunks

    def choice(self, choice: Choice) -> rt.ChatChoice:
        logprobs = chat_logprobs(self.token_text, choice.logprobs) if self.logprobs else None
        content, calls = assemble(self.tools, "".join(choice.text)).message()
        message: rt.ChatMessage = {"role": "assistant", "content": content if self.tools else content or ""}
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


def _item_chunks(update: ChoiceUpdate) -> list[rt.ChatChunkChoice]:
    """The chunks of one update's item changes, in order: text pieces as ``content``; a call's
    start as a chunk of its own (id, name, ``arguments: ""``, as OpenAI streams it), its argument
    pieces in the next (consecutive pieces of one kind share a chunk)."""
    index, items = update.choice.index, update.items
    chunks: list[rt.ChatChunkChoice] = []
    for event in update.events:
        item = items.items[event.index]
        last = chunks[-1]["delta"] if chunks else {}
        if item.kind == "text":
            if event.kind != "piece":
                continue
            if "content" in last and "tool_calls" not in last:
                last["content"] = (last["content"] or "") + event.text
            else:
                chunks.append(chat_chunk_choice(index, {"content": event.text}))
        elif event.kind == "start":
            number = items.call_number(event.index)
            chunks.append(chat_chunk_choice(index, {"tool_calls": [{
                "index": number, "id": item.call_id or "", "type": "function",
                "function": {"name": item.name or "", "arguments": ""}}]}))
        elif event.kind == "piece":
            number = items.call_number(event.index)
            entries = last.get("tool_calls", [])
            if len(entries) == 1 and "id" not in entries[0] and entries[0]["index"] == number:
                entries[0]["function"]["arguments"] = entries[0]["function"].get("arguments", "") + event.text
            else:
                chunks.append(chat_chunk_choice(index, {"tool_calls": [{"index": number,
                                                                        "function": {"arguments": event.text}}]}))
    return chunks


def _finish_reason(engine_reason: str | None, num_calls: int) -> str | None:
    """OpenAI's ``tool_calls`` when a choice that called a tool ended by itself."""
    return "tool_calls" if num_calls and engine_reason == "stop" else engine_reason
