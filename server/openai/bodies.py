"""OpenAI response pieces both endpoints share: the envelope, usage, ``speculative``, logprobs.

Shapes follow OpenAI exactly (``text_completion``, ``chat.completion``, ``chat.completion.chunk``)
with one addition: a ``speculative`` object on every completion and on the final streamed chunk,
saying how much speculation helped this request.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from server.openai import response_types as rt
from specdec_core.engine.outputs import RequestStats, TokenLogprob

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


def speculative_summary(method: str, stats: Iterable[RequestStats | None]) -> rt.Speculative:
    """The ``speculative`` object: a request's choices' counters summed by the engine's own
    ``RequestStats.total``, the ratios read from it (defined once in ``specdec_core.engine.stats``)."""
    total = RequestStats.total(stats)
    return {
        "method": method,
        "draft_tokens": total.draft_tokens,
        "accepted_tokens": total.accepted_tokens,
        "steps": total.verify_steps,
        "acceptance_rate": total.acceptance_rate,
        "mean_accepted_length": total.mean_accepted_length,
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
        tokens: list[str] = []
        token_logprobs: list[float] = []
        top_logprobs: list[dict[str, float]] = []
        offsets: list[int] = []
        for lp in logprobs:
            token = self._text(lp.token_id)
            tokens.append(token)
            token_logprobs.append(lp.logprob)
            # OpenAI: the top alternatives, plus the sampled token itself.
            top = {self._text(tid): value for tid, value in lp.top}
            top.setdefault(token, lp.logprob)
            top_logprobs.append(top)
            offsets.append(self._offset)
            self._offset += len(token)
        return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs, "text_offset": offsets}


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
