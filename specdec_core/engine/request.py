"""A request inside the engine: the record of its tokens, its cache positions in both models, its
status from waiting to finished, and its statistics.

What a request does with that state is split by job into the classes ``Request`` is built from,
each in the package that owns the job: the row rules of its logits (``decoding/row_rules.py``),
what it has learned of each proposer's acceptance (``speculation/acceptance.py``), its replayable
random stream (``request_draws.py``), the text of its tokens (``request_text.py``) and its
token-level stops (``request_stops.py``). Who writes each piece: docs/architecture.md."""

from __future__ import annotations

import enum
import random
import time
from typing import TYPE_CHECKING

from specdec_core.decoding.detokenizer import IncrementalDetokenizer
from specdec_core.decoding.row_rules import RowRules
from specdec_core.decoding.sampling_params import SamplingParams
from specdec_core.decoding.token_logprob import TokenLogprob
from specdec_core.engine.outputs import FinishReason, RequestStats
from specdec_core.engine.provenance import TextProvenance
from specdec_core.engine.request_draws import DrawStream
from specdec_core.engine.request_stops import TokenStops
from specdec_core.engine.request_text import RequestText
from specdec_core.speculation.acceptance import AcceptanceLearning, prior_estimates

if TYPE_CHECKING:  # types only: the request holds these, never calls into their modules' imports
    from specdec_core.decoding.grammar import GrammarState
    from specdec_core.speculation.ngram_index import NgramIndex
    from specdec_core.speculation.suffix_trie import SuffixIndex


class Status(enum.Enum):
    """Where a request is: waiting for admission, running (it holds KV blocks), finished. The
    scheduler moves it between waiting and running; the commit (or an abort) finishes it."""

    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Request(RowRules, AcceptanceLearning, DrawStream, RequestText, TokenStops):
    """Sequence state: the record every part of the engine reads, and the parts its bases add.

    Invariants while running: the target cache holds ``all_ids[:num_computed]``; once the prompt is
    prefilled ``num_computed == len(all_ids) - 1`` (the last token is fed by the next step). The
    draft cache holds ``all_ids[:draft_computed]``.
    """

    def __init__(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: SamplingParams,
        generator: random.Random,
        detokenizer: IncrementalDetokenizer,
        max_spec_tokens: int,
        *,
        ngram: NgramIndex | None = None,
        suffix: SuffixIndex | None = None,
        grammar: GrammarState | None = None,
        min_tokens_ban: list[int] | None = None,
        provenance: TextProvenance | None = None,
    ) -> None:
        self.request_id = request_id
        self.prompt_ids = prompt_ids
        self.params = params
        self.generator = generator
        self.detokenizer = detokenizer
        self.max_spec_tokens = max_spec_tokens
        self.all_ids: list[int] = list(prompt_ids)
        self.output_ids: list[int] = []
        self.num_computed = 0
        self.draft_computed = 0
        # The KV blocks holding this request's positions (``kv_cache``): the scheduler's, empty
        # unless the request is running.
        self.blocks: list[int] = []
        # Prompt chunks already offered to the prefix cache: the target's and the draft's; and the
        # hash chain naming the chunks of ``all_ids`` so far (each chunk hashed once).
        self.recorded_chunks = (0, 0)
        self.chunk_keys: list[bytes] = []
        self.status = Status.WAITING
        self.finish_reason: FinishReason | None = None
        self.error: str | None = None
        self.stats = RequestStats(prompt_tokens=len(prompt_ids), arrival_time=time.monotonic())
        # This request's own acceptance per proposer, for the speculation policy (``AcceptanceLearning``).
        self.acceptance = prior_estimates()
        # Prompt-lookup index over all_ids, for the n-gram proposer (None when it is not used).
        self.ngram = ngram
        # Suffix trie over all_ids, for the suffix proposer (None when it is not used).
        self.suffix = suffix
        # The grammar state at the committed tokens and the ``min_tokens`` ban (``RowRules``).
        self.grammar = grammar
        self.min_tokens_ban = min_tokens_ban or []
        # Prompt log-probabilities of prompt tokens 1.. as the prefill computes them (when asked
        # for); handed out once, with the request's first delta.
        self.prompt_logprobs: list[TokenLogprob] = []
        self.prompt_logprobs_sent = False
        # Whose text the detokenizer holds back (``RequestText``; None: no provenance asked for).
        self.provenance = provenance

    def take_prompt_logprobs(self) -> list[TokenLogprob | None] | None:
        """The whole prompt's log-probabilities (the first token's ``None``) the first time the
        request emits a delta after its prefill, if it asked for them; else None."""
        if self.params.prompt_logprobs is None or self.prompt_logprobs_sent:
            return None
        self.prompt_logprobs_sent = True
        return [None, *self.prompt_logprobs]

    @property
    def in_prefill(self) -> bool:
        """Known tokens are still to be computed in chunks: the prompt, or after a preemption
        everything but the last token (which a decode step feeds)."""
        return self.num_computed < len(self.prompt_ids) or self.num_computed < self.num_tokens - 1

    @property
    def num_tokens(self) -> int:
        return len(self.all_ids)

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED

    def finish(self, reason: FinishReason, error: str | None = None) -> None:
        self.status = Status.FINISHED
        self.finish_reason = reason
        self.error = error
        self.stats.finish_time = time.monotonic()
