"""OpenAI response pieces both endpoints share: the envelope, usage, logprobs.

Shapes follow OpenAI exactly (``text_completion``, ``chat.completion``, ``chat.completion.chunk``)
with one addition: a ``speculative`` object on every completion and on the final streamed chunk,
saying how much speculation helped this request.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from server.api import response_types as rt
from specdec_core.decoding.token_logprob import TokenLogprob

if TYPE_CHECKING:
    from server.settings import ServerSettings


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> rt.Usage:
    """OpenAI's usage object; ``cached_tokens``: prompt tokens the prefix cache served."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


class TokenText:
    """Token id -> its text, memoised (logprobs name every emitted token and its alternatives)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            text = self._tokenizer.decode([token_id])
            self._cache[token_id] = text
        return text


class CompletionLogprobs:
    """The legacy completions ``logprobs`` object, built incrementally (streams send pieces).

    ``text_offset`` counts characters from the start of the returned text, so it continues
    across chunks.
    """

    def __init__(self, token_text: TokenText, start_offset: int = 0) -> None:
        self._text = token_text
        self._offset = start_offset

    def piece(self, logprobs: Sequence[TokenLogprob]) -> rt.CompletionLogprobs:
        """Generated tokens, each with its top alternatives."""
        return self._entries([(lp.token_id, lp) for lp in logprobs], None)

    def prompt_piece(self, prompt_ids: Sequence[int], logprobs: Sequence[TokenLogprob | None],
                     n_top: int) -> rt.CompletionLogprobs:
        """An echoed prompt's tokens (OpenAI: the first one's logprob and top_logprobs null), each
        cut to ``n_top`` alternatives (the engine may have computed more for ``prompt_logprobs``)."""
        return self._entries(list(zip(prompt_ids, logprobs, strict=True)), n_top)

    def _entries(self, entries: Sequence[tuple[int, TokenLogprob | None]], n_top: int | None) -> rt.CompletionLogprobs:
        out: rt.CompletionLogprobs = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for token_id, lp in entries:
            token = self._text(token_id)
            out["tokens"].append(token)
            out["text_offset"].append(self._offset)
            self._offset += len(token)
            if lp is None:
                out["token_logprobs"].append(None)
                out["top_logprobs"].append(None)
                continue
            out["token_logprobs"].append(lp.logprob)
            # OpenAI: the top alternatives, plus the token itself.
            top = {self._text(tid): value for tid, value in lp.top[:n_top]}
            top.setdefault(token, lp.logprob)
            out["top_logprobs"].append(top)
        return out

    @staticmethod
    def join(first: rt.CompletionLogprobs, second: rt.CompletionLogprobs) -> rt.CompletionLogprobs:
        """An echoed prompt's piece followed by the generated tokens' piece."""
        return {key: first[key] + second[key] for key in first}  # type: ignore[literal-required, operator, return-value]


def prompt_logprobs(token_text: TokenText, logprobs: Sequence[TokenLogprob | None], n_top: int) -> rt.PromptLogprobs:
    """vLLM's ``prompt_logprobs``: per prompt token, ``{token id: {logprob, rank, decoded_token}}``
    for the token itself and its ``n_top`` most likely alternatives (ranks 1..n_top); the first
    token's entry is null."""
    out: rt.PromptLogprobs = []
    for lp in logprobs:
        if lp is None:
            out.append(None)
            continue
        entry = {str(lp.token_id): rt.PromptLogprob(logprob=lp.logprob, rank=lp.rank, decoded_token=token_text(lp.token_id))}
        for rank, (tid, value) in enumerate(lp.top[:n_top], start=1):
            entry.setdefault(str(tid), rt.PromptLogprob(logprob=value, rank=rank, decoded_token=token_text(tid)))
        out.append(entry)
    return out


def chat_logprobs(token_text: TokenText, logprobs: Sequence[TokenLogprob]) -> rt.ChatLogprobs:
    """The chat ``logprobs`` object: ``{"content": [{token, logprob, bytes, top_logprobs}]}``."""

    def entry(token_id: int, value: float) -> rt.ChatTokenLogprob:
        token = token_text(token_id)
        return {"token": token, "logprob": value, "bytes": list(token.encode("utf-8"))}

    content = []
    for lp in logprobs:
        item = entry(lp.token_id, lp.logprob)
        item["top_logprobs"] = [entry(tid, value) for tid, value in lp.top]
        content.append(item)
    return {"content": content}


def system_fingerprint(settings: ServerSettings) -> str:
    """OpenAI's ``system_fingerprint``: names the backend configuration that can change outputs for
    the same request and seed (the server's version, the models, device, dtype, quantization), so a
    client comparing answers across runs sees when it changed. Stable across restarts of one
    configuration; speculation settings are left out because they never change the output."""
    from server import __version__

    cfg = settings.engine
    parts = [__version__, str(cfg.model), str(cfg.draft_model), settings.served_model_name or "",
             cfg.device, cfg.dtype, cfg.quantize]
    return "fp_" + hashlib.sha256("\0".join(parts).encode()).hexdigest()[:12]


def envelope(
    obj: str, completion_id: str, created: int, model: str, choices: list[rt.ResponseChoice], usage_: rt.Usage | None,
    speculative: rt.Speculative | None, fingerprint: str = "",
) -> rt.Envelope:
    """The envelope both endpoints share; ``speculative`` is specdec's report, added when present.
    The choices inside are the endpoint's own (``server.openai.renderers``)."""
    body: rt.Envelope = {"id": completion_id, "object": obj, "created": created, "model": model,
                            "choices": choices, "usage": usage_, "system_fingerprint": fingerprint}
    if speculative is not None:
        body["speculative"] = speculative
    return body
