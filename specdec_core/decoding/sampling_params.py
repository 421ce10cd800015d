"""Per-request sampling parameters, validated once at the engine boundary."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from specdec_core.decoding.structured_output import StructuredOutput

# What ``logprobs`` reports (vLLM's names): the model's own distribution, or the one sampled from.
LogprobsMode = Literal["raw_logprobs", "processed_logprobs"]
MAX_LOGPROBS = 20

# Temperatures below this are greedy (as in vLLM): dividing logits by 1e-38 overflows float32 to
# inf, and the softmax of that is NaN, so sampling produced garbage rather than the argmax it tends to.
GREEDY_BELOW = 1e-5


@dataclass
class SamplingParams:
    """What a request asks for. Validation errors raise ``ValueError`` naming the field.

    ``num_speculative_tokens``: ``None`` uses the engine default, ``0`` turns speculation off for
    this request, a smaller positive value lowers k (it is capped by the engine's k).
    ``logprobs``: number of top alternatives per emitted token (0 = only the chosen token's
    log-probability, ``None`` = none). ``logprobs_mode``: ``raw_logprobs`` (the target's own
    distribution: under a grammar, the unconstrained model's) or ``processed_logprobs`` (the
    distribution sampled from: after the grammar mask, ``min_tokens`` ban, logit bias, penalties,
    and for sampled requests temperature, top-k and top-p; greedy requests: before the argmax).
    ``prompt_logprobs``: per prompt token after the first, its raw log-probability, rank and the
    this many most likely alternatives (``None`` = none); the request then takes nothing from the
    prefix cache, so every prompt position is computed. ``max_tokens`` 0: the prompt is only
    scored (prompt log-probabilities), nothing is generated.
    ``logit_bias``: token id -> value in [-100, 100] added to that token's logit before warping
    (draft and target alike). ``min_tokens``: EOS and ``stop_token_ids`` are masked until this many
    tokens were generated. ``structured``: the output must match it (see ``structured_output``).
    A ``temperature`` below ``GREEDY_BELOW`` (1e-5) is greedy, as 0 is. ``provenance``: each
    delta also splits its text into pieces by the source of the token that wrote it (see
    ``specdec_core.engine.provenance``); it costs one detokenizer call per token, so it is off
    unless asked for, and it never changes the tokens or the text. ``cache_salt``: the request
    shares prefix-cache blocks only with requests of the same salt (see ``PrefixCache``).
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = disabled
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    logprobs_mode: LogprobsMode = "raw_logprobs"
    num_speculative_tokens: int | None = None
    logit_bias: dict[int, float] = field(default_factory=dict)
    min_tokens: int = 0
    structured: StructuredOutput | None = None
    provenance: bool = False
    cache_salt: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        checks = [
            ("max_tokens", self.max_tokens >= 0, "must be >= 0"),
            ("temperature", 0.0 <= self.temperature <= 2.0, "must be in [0, 2]"),
            ("top_p", 0.0 < self.top_p <= 1.0, "must be in (0, 1]"),
            ("top_k", self.top_k >= 0, "must be >= 0 (0 disables it)"),
            ("presence_penalty", -2.0 <= self.presence_penalty <= 2.0, "must be in [-2, 2]"),
            ("frequency_penalty", -2.0 <= self.frequency_penalty <= 2.0, "must be in [-2, 2]"),
            ("logprobs", self.logprobs is None or 0 <= self.logprobs <= MAX_LOGPROBS, f"must be in [0, {MAX_LOGPROBS}]"),
            ("prompt_logprobs", self.prompt_logprobs is None or 0 <= self.prompt_logprobs <= MAX_LOGPROBS,
             f"must be in [0, {MAX_LOGPROBS}]"),
            ("logprobs_mode", self.logprobs_mode in ("raw_logprobs", "processed_logprobs"),
             "must be 'raw_logprobs' or 'processed_logprobs'"),
            ("stop", all(isinstance(s, str) and s for s in self.stop), "must be non-empty strings"),
            ("min_tokens", 0 <= self.min_tokens <= self.max_tokens, "must be in [0, max_tokens]"),
            (
                "logit_bias",
                all(isinstance(t, int) and t >= 0 and -100.0 <= b <= 100.0 for t, b in self.logit_bias.items()),
                "must map token ids >= 0 to values in [-100, 100]",
            ),
            ("cache_salt", self.cache_salt is None or (isinstance(self.cache_salt, str) and self.cache_salt != ""),
             "must be a non-empty string"),
            (
                "num_speculative_tokens",
                self.num_speculative_tokens is None or self.num_speculative_tokens >= 0,
                "must be >= 0",
            ),
        ]
        for name, ok, why in checks:
            if not ok:
                raise ValueError(f"{name} {why}, got {getattr(self, name)!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW

    @property
    def has_penalties(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0


def outside_vocab(vocab_size: int, named_ids: dict[str, Iterable[int]]) -> tuple[str, int] | None:
    """The first token id outside ``[0, vocab_size)`` and the field that names it, else None.

    The one rule for every id a request names (prompt ids, ``stop_token_ids``, ``logit_bias``
    keys): an id past the vocabulary used to reach the sampler and fail the whole batch there
    (an ``IndexError`` in the ban mask), so the server checks it while validating (a 400) and the
    engine again at its own boundary (a ``ValueError``)."""
    for name, ids in named_ids.items():
        for tid in ids:
            if not isinstance(tid, int) or isinstance(tid, bool) or not 0 <= tid < vocab_size:
                return name, tid
    return None
