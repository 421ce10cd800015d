"""OpenAI request bodies -> validated requests -> ``SamplingParams``.

Every field is accounted for: supported fields are type- and range-checked, OpenAI fields this
server does not implement are refused by name, and unknown fields are refused too, so a client
never gets output that silently ignored something it asked for.

Extensions (documented in ``specdec serve --help``): ``top_k`` (0 or -1 = off),
``num_speculative_tokens`` (int >= 0: caps k for this request, 0 = no speculation),
``speculative`` (``false`` = no speculation), ``ignore_eos``, ``stop_token_ids``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specdec_core.sampling_params import SamplingParams

from server.errors import invalid_request, unsupported
from server.validation import (
    get_bool,
    get_float,
    get_int,
    get_int_list,
    get_object,
    get_stop,
    get_str,
    is_int,
    type_name,
)

MAX_N = 128
MAX_COMPLETION_LOGPROBS = 5
MAX_CHAT_TOP_LOGPROBS = 20
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1

_COMMON = {
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "n",
    "stream",
    "stream_options",
    "stop",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "user",
    "logit_bias",
    # extensions
    "top_k",
    "num_speculative_tokens",
    "speculative",
    "ignore_eos",
    "stop_token_ids",
}
COMPLETION_FIELDS = _COMMON | {"prompt", "logprobs", "echo", "suffix", "best_of"}
CHAT_FIELDS = _COMMON | {
    "messages",
    "max_completion_tokens",
    "logprobs",
    "top_logprobs",
    "response_format",
    "tools",
    "tool_choice",
    "functions",
    "function_call",
    "parallel_tool_calls",
}
CHAT_ROLES = {"system", "developer", "user", "assistant"}


@dataclass(frozen=True)
class SamplingOptions:
    """The sampling part of a request, shared by all of its choices."""

    temperature: float
    top_p: float
    top_k: int
    presence_penalty: float
    frequency_penalty: float
    seed: int | None
    stop: list[str]
    stop_token_ids: list[int]
    ignore_eos: bool
    logprobs: int | None
    num_speculative_tokens: int | None

    @property
    def speculation_disabled(self) -> bool:
        return self.num_speculative_tokens == 0

    def params(self, max_tokens: int, choice: int) -> SamplingParams:
        """Engine parameters for one choice; choice i of a seeded request uses seed + i."""
        seed = None
        if self.seed is not None:
            seed = (self.seed + choice - SEED_MIN) % 2**64 + SEED_MIN
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            seed=seed,
            stop=list(self.stop),
            stop_token_ids=list(self.stop_token_ids),
            ignore_eos=self.ignore_eos,
            logprobs=self.logprobs,
            num_speculative_tokens=self.num_speculative_tokens,
        )


@dataclass(frozen=True)
class CompletionRequest:
    model: str | None
    prompts: list[str | list[int]]
    max_tokens: int
    n: int
    stream: bool
    include_usage: bool
    echo: bool
    sampling: SamplingOptions


@dataclass(frozen=True)
class ChatRequest:
    model: str | None
    messages: list[dict[str, str]]
    # None: as many as the context allows (OpenAI's chat default).
    max_tokens: int | None
    max_tokens_param: str
    n: int
    stream: bool
    include_usage: bool
    sampling: SamplingOptions


def _require_object(body: Any) -> dict:
    if not isinstance(body, dict):
        raise invalid_request(f"The request body must be a JSON object, got {type_name(body)}.")
    return body


def _reject_unknown(body: dict, allowed: set[str]) -> None:
    for key in body:
        if key not in allowed:
            raise invalid_request(f"Unrecognized request argument supplied: {key}", key, code="unknown_parameter")


def _common(body: dict, *, logprobs: int | None) -> tuple[str | None, int, bool, bool, SamplingOptions]:
    """Fields both endpoints share: (model, n, stream, include_usage, sampling)."""
    logit_bias = body.get("logit_bias")
    if logit_bias is not None:
        if not isinstance(logit_bias, dict):
            raise invalid_request("'logit_bias' must be an object.", "logit_bias")
        if logit_bias:
            raise unsupported("logit_bias")
    model = get_str(body, "model")
    get_str(body, "user")  # accepted (and type-checked); only meaningful to OpenAI's abuse monitoring
    n = get_int(body, "n", 1, minimum=1, maximum=MAX_N)
    assert n is not None
    stream = get_bool(body, "stream", False)
    include_usage = False
    options = get_object(body, "stream_options")
    if options is not None:
        if not stream:
            raise invalid_request("'stream_options' is only allowed when 'stream' is true.", "stream_options")
        for key in options:
            if key != "include_usage":
                raise invalid_request(f"Unrecognized stream option: {key}", f"stream_options.{key}")
        include_usage = get_bool(options, "include_usage", False)

    speculative = get_bool(body, "speculative", True)
    num_spec = get_int(body, "num_speculative_tokens", None, minimum=0)
    if not speculative:
        if num_spec:
            raise invalid_request(
                "'speculative': false contradicts 'num_speculative_tokens' > 0.", "num_speculative_tokens"
            )
        num_spec = 0

    top_k = get_int(body, "top_k", 0, minimum=-1)
    seed = get_int(body, "seed", None, minimum=SEED_MIN, maximum=SEED_MAX)
    sampling = SamplingOptions(
        temperature=get_float(body, "temperature", 1.0, minimum=0.0, maximum=2.0),
        top_p=get_float(body, "top_p", 1.0, minimum=0.0, maximum=1.0, exclusive_minimum=True),
        top_k=0 if top_k == -1 else int(top_k or 0),
        presence_penalty=get_float(body, "presence_penalty", 0.0, minimum=-2.0, maximum=2.0),
        frequency_penalty=get_float(body, "frequency_penalty", 0.0, minimum=-2.0, maximum=2.0),
        seed=seed,
        stop=get_stop(body),
        stop_token_ids=get_int_list(body, "stop_token_ids"),
        ignore_eos=get_bool(body, "ignore_eos", False),
        logprobs=logprobs,
        num_speculative_tokens=num_spec,
    )
    return model, n, stream, include_usage, sampling


def parse_completion_request(body: Any) -> CompletionRequest:
    body = _require_object(body)
    _reject_unknown(body, COMPLETION_FIELDS)
    suffix = body.get("suffix")
    if suffix is not None:
        if not isinstance(suffix, str):
            raise invalid_request("'suffix' must be a string.", "suffix")
        if suffix:
            raise unsupported("suffix", "Insertion (fill-in-the-middle) is not implemented.")
    if "prompt" not in body or body["prompt"] is None:
        raise invalid_request("'prompt' is required.", "prompt")
    prompts = _parse_prompt(body["prompt"])
    logprobs = get_int(body, "logprobs", None, minimum=0, maximum=MAX_COMPLETION_LOGPROBS)
    echo = get_bool(body, "echo", False)
    if echo and logprobs is not None:
        raise invalid_request(
            "'echo' together with 'logprobs' is not supported: the engine does not compute prompt "
            "log-probabilities.",
            "echo",
        )
    max_tokens = get_int(body, "max_tokens", 16, minimum=1)
    assert max_tokens is not None
    model, n, stream, include_usage, sampling = _common(body, logprobs=logprobs)
    best_of = get_int(body, "best_of", None, minimum=1)
    if best_of is not None and best_of != n:
        raise unsupported("best_of", "Only best_of == n (or omitted) is accepted; candidates are never discarded.")
    return CompletionRequest(
        model=model,
        prompts=prompts,
        max_tokens=max_tokens,
        n=n,
        stream=stream,
        include_usage=include_usage,
        echo=echo,
        sampling=sampling,
    )


def _parse_prompt(prompt: Any) -> list[str | list[int]]:
    """A string, a list of strings, a list of token ids, or a list of lists of token ids."""
    bad = invalid_request(
        "'prompt' must be a string, an array of strings, an array of token ids, or an array of arrays of token ids.",
        "prompt",
    )
    if isinstance(prompt, str):
        return [prompt]
    if not isinstance(prompt, list) or not prompt:
        if isinstance(prompt, list):
            raise invalid_request("'prompt' must not be empty.", "prompt")
        raise bad
    if all(isinstance(p, str) for p in prompt):
        return list(prompt)
    if all(is_int(t) for t in prompt):
        return [list(prompt)]
    if all(isinstance(p, list) for p in prompt):
        if not all(p and all(is_int(t) for t in p) for p in prompt):
            raise invalid_request("Each token-id prompt must be a non-empty array of integers.", "prompt")
        return [list(p) for p in prompt]
    raise bad


def parse_chat_request(body: Any) -> ChatRequest:
    body = _require_object(body)
    _reject_unknown(body, CHAT_FIELDS)
    for name in ("tools", "functions"):
        value = body.get(name)
        if value is not None and value != []:
            raise unsupported(name, "Tool and function calling are not implemented.")
    for name in ("tool_choice", "function_call"):
        value = body.get(name)
        if value is not None and value != "none":
            raise unsupported(name, "Tool and function calling are not implemented.")
    if body.get("parallel_tool_calls") is not None:
        raise unsupported("parallel_tool_calls", "Tool and function calling are not implemented.")
    response_format = get_object(body, "response_format")
    if response_format is not None and response_format.get("type") != "text":
        raise unsupported("response_format", "Only {\"type\": \"text\"} is accepted.")

    if "messages" not in body or body["messages"] is None:
        raise invalid_request("'messages' is required.", "messages")
    messages = _parse_messages(body["messages"])

    want_logprobs = get_bool(body, "logprobs", False)
    top = get_int(body, "top_logprobs", None, minimum=0, maximum=MAX_CHAT_TOP_LOGPROBS)
    if top is not None and not want_logprobs:
        raise invalid_request("'top_logprobs' requires 'logprobs': true.", "top_logprobs")
    logprobs = (top or 0) if want_logprobs else None

    max_tokens = get_int(body, "max_tokens", None, minimum=1)
    max_completion = get_int(body, "max_completion_tokens", None, minimum=1)
    param = "max_tokens"
    if max_completion is not None:
        if max_tokens is not None and max_tokens != max_completion:
            raise invalid_request(
                "Give either 'max_tokens' or 'max_completion_tokens' (they disagree).", "max_completion_tokens"
            )
        max_tokens, param = max_completion, "max_completion_tokens"

    model, n, stream, include_usage, sampling = _common(body, logprobs=logprobs)
    return ChatRequest(
        model=model,
        messages=messages,
        max_tokens=max_tokens,
        max_tokens_param=param,
        n=n,
        stream=stream,
        include_usage=include_usage,
        sampling=sampling,
    )


def _parse_messages(messages: Any) -> list[dict[str, str]]:
    if not isinstance(messages, list):
        raise invalid_request(f"'messages' must be an array, got {type_name(messages)}.", "messages")
    if not messages:
        raise invalid_request("'messages' must contain at least one message.", "messages")
    out: list[dict[str, str]] = []
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise invalid_request(f"'{where}' must be an object.", where)
        for key in msg:
            if key in ("tool_calls", "tool_call_id", "function_call"):
                if msg[key] is not None:
                    raise unsupported(f"{where}.{key}", "Tool and function calling are not implemented.")
            elif key not in ("role", "content", "name"):
                raise invalid_request(f"Unrecognized message field: {key}", f"{where}.{key}")
        role = msg.get("role")
        if role not in CHAT_ROLES:
            if role in ("tool", "function"):
                raise unsupported(f"{where}.role", f"Role {role!r} is not supported (no tool calling).")
            raise invalid_request(
                f"'{where}.role' must be one of {', '.join(sorted(CHAT_ROLES))}, got {role!r}.", f"{where}.role"
            )
        content = _message_text(msg.get("content"), f"{where}.content")
        entry = {"role": "system" if role == "developer" else role, "content": content}
        name = msg.get("name")
        if name is not None:
            if not isinstance(name, str):
                raise invalid_request(f"'{where}.name' must be a string.", f"{where}.name")
            entry["name"] = name
        out.append(entry)
    return out


def _message_text(content: Any, where: str) -> str:
    """A message's content as text: a string, or an array of text parts (joined)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise invalid_request(f"'{where}[{j}]' must be a content part object with a 'type'.", f"{where}[{j}]")
            if part["type"] != "text":
                raise unsupported(f"{where}[{j}].type", f"Content parts of type {part['type']!r} are not supported.")
            text = part.get("text")
            if not isinstance(text, str):
                raise invalid_request(f"'{where}[{j}].text' must be a string.", f"{where}[{j}].text")
            texts.append(text)
        return "".join(texts)
    if content is None:
        raise invalid_request(f"'{where}' is required.", where)
    raise invalid_request(f"'{where}' must be a string or an array of content parts.", where)
