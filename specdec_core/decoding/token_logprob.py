"""``TokenLogprob``, the one record of a token's log-probability: ``decoding.logprobs`` builds it
from logits, the engine hands it out in ``RequestOutput``, the server renders it. A module of its
own, without torch, so decoding owns the type without the engine's outputs (or the server) paying
for torch to name it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TokenLogprob:
    """The target's log-probability of a token (emitted, or of the prompt) and its top
    alternatives, most likely first; ``rank``: 1 + how many tokens were more likely (prompt
    tokens only, as vLLM reports it)."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)
    rank: int | None = None
