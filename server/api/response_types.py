"""The response bodies and chunks, typed as OpenAI documents them (plus specdec's ``speculative``).

The requests are pydantic models because they are validated; responses are only built, so
``TypedDict`` s describe them at no run-time cost and let the type checker hold every renderer to
the same shapes.
"""

from __future__ import annotations

from typing import Literal, TypedDict

from typing_extensions import NotRequired


class PromptTokensDetails(TypedDict):
    cached_tokens: int  # prompt tokens served from the prefix cache


class Usage(TypedDict):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class Speculative(TypedDict):
    """specdec's report of what speculation did for one request (all its choices)."""

    method: str
    draft_tokens: int
    accepted_tokens: int
    steps: int
    acceptance_rate: float
    mean_accepted_length: float


class CompletionLogprobs(TypedDict):
    """The legacy completions ``logprobs`` object (or one streamed piece of it)."""

    tokens: list[str]
    token_logprobs: list[float | None]  # None: an echoed prompt's first token
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class PromptLogprob(TypedDict):
    """vLLM's entry for one token of a prompt position (keyed by the token id as a string)."""

    logprob: float
    rank: int | None
    decoded_token: str


# vLLM's ``prompt_logprobs``: per prompt token, the token and its top alternatives; the first null.
PromptLogprobs = list[dict[str, PromptLogprob] | None]


class ChatTokenLogprob(TypedDict):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: NotRequired[list[ChatTokenLogprob]]


class ChatLogprobs(TypedDict):
    content: list[ChatTokenLogprob]


class ProvenancePiece(TypedDict):
    """specdec's ``provenance`` extension: a piece of a chunk's text and how its token was
    produced (a proposer's name such as ``draft`` or ``ngram``, or ``target``)."""

    text: str
    source: str


class CompletionChoice(TypedDict):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: str | None
    prompt_logprobs: NotRequired[PromptLogprobs]
    provenance: NotRequired[list[ProvenancePiece]]  # streamed, with "specdec_provenance": true


class FunctionCall(TypedDict):
    name: str
    arguments: str


class ToolCall(TypedDict):
    id: str
    type: Literal["function"]
    function: FunctionCall
    index: NotRequired[int]  # streamed calls are numbered within their choice


class FunctionCallDelta(TypedDict, total=False):
    name: str
    arguments: str


class ToolCallDelta(TypedDict, total=False):
    """A streamed piece of a call: the first names it (``id``, ``type``, ``function.name``,
    ``arguments: ""``), the next ones carry only ``index`` and ``function.arguments`` text."""

    index: int
    id: str
    type: Literal["function"]
    function: FunctionCallDelta


class ChatDelta(TypedDict, total=False):
    role: Literal["assistant"]
    content: str | None
    tool_calls: list[ToolCallDelta]


class ChatChunkChoice(TypedDict):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None
    finish_reason: str | None
    provenance: NotRequired[list[ProvenancePiece]]  # with "specdec_provenance": true


class ChatMessage(TypedDict):
    role: Literal["assistant"]
    content: str | None
    tool_calls: NotRequired[list[ToolCall]]


class ChatChoice(TypedDict):
    index: int
    message: ChatMessage
    logprobs: ChatLogprobs | None
    finish_reason: str | None


ResponseChoice = CompletionChoice | ChatChunkChoice | ChatChoice


class Envelope(TypedDict):
    """A whole body or one chunk: ``text_completion``, ``chat.completion`` or ``chat.completion.chunk``."""

    id: str
    object: str
    created: int
    model: str
    choices: list[ResponseChoice]
    usage: Usage | None
    system_fingerprint: str
    speculative: NotRequired[Speculative]
    prompt_logprobs: NotRequired[PromptLogprobs]  # chat, as vLLM: the prompt all choices share
