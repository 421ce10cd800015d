"""A request's life inside the engine: its tokens, its cache positions in both models, its
sampling state and its statistics."""

from __future__ import annotations

import enum
import random
import time
from typing import TYPE_CHECKING

import torch

from specdec_core.decoding.detokenizer import IncrementalDetokenizer
from specdec_core.decoding.sampling import RowParams
from specdec_core.decoding.sampling_params import SamplingParams
from specdec_core.decoding.token_logprob import TokenLogprob
from specdec_core.engine.outputs import FinishReason, RequestStats
from specdec_core.engine.provenance import TextPiece, TextProvenance
from specdec_core.speculation.acceptance import LOOKUP_SOURCES, PRIOR, AcceptanceEstimate, Source

if TYPE_CHECKING:  # types only: the request holds these, never calls into their modules' imports
    from specdec_core.decoding.grammar import GrammarState
    from specdec_core.speculation.ngram_index import NgramIndex
    from specdec_core.speculation.suffix_trie import SuffixIndex


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Request:
    """Sequence state.

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
        # This request's own acceptance per proposer, for the speculation policy.
        self.acceptance = {source: AcceptanceEstimate(prior) for source, prior in PRIOR.items()}
        # Prompt-lookup index over all_ids, for the n-gram proposer (None when it is not used).
        self.ngram = ngram
        # Suffix trie over all_ids, for the suffix proposer (None when it is not used).
        self.suffix = suffix
        # Structured output: the grammar state at the committed tokens (None: unconstrained).
        self.grammar = grammar
        # Token ids masked until ``params.min_tokens`` tokens are out (EOS unless ignored, stop ids).
        self.min_tokens_ban = min_tokens_ban or []
        # Prompt log-probabilities of prompt tokens 1.. as the prefill computes them (when asked
        # for); handed out once, with the request's first delta.
        self.prompt_logprobs: list[TokenLogprob] = []
        self.prompt_logprobs_sent = False
        # Whose text the detokenizer holds back (None: the request did not ask for provenance).
        self.provenance = provenance

    def alpha(self, source: Source) -> float:
        """The acceptance the policy acts on for ``source``. A lookup's is its estimate's lower
        bound (``AcceptanceEstimate.confident``): it learns at every pass whether chosen or not
        (``learn``), so caution costs it no evidence. The draft model's is the mean, from an
        optimistic prior: it learns only from the drafts it is chosen for, so it must be tried to
        be known (probes bound what that costs)."""
        estimate = self.acceptance[source]
        return estimate.confident if source in LOOKUP_SOURCES else estimate.alpha

    def learn(self, source: Source | None, accepted: int, proposed: int, lookups: dict[Source, list[int]],
              committed: list[int]) -> None:
        """One verify pass that committed ``committed`` (the target's tokens, before any stop cut).
        The draft model learns from the drafts it verified (``accepted`` of ``proposed``); every
        lookup the policy made for this pass, chosen or not (``lookups``, their first chains), is
        scored against ``committed``. A lookup costs no forward, so each learns at every pass it
        had a match: an estimate fed only by verified passes stops learning once the policy stops
        choosing its source, and needed relaxing back to the prior, which re-tried lookups that
        did not pay (chat at 4 streams kept 0.26 of them, 2026-11-27)."""
        if source == "draft" and proposed:
            self.acceptance["draft"].update(accepted, proposed)
        for lookup, proposal in lookups.items():
            self.acceptance[lookup].score(proposal, committed)

    def row_params(self, num_drafts: int) -> RowParams:
        """How the logits row after the committed tokens plus ``num_drafts`` drafts is warped.
        The draft model's q and the target's p both come from here: one rule for both is what
        keeps speculation lossless under penalties, ``min_tokens`` and grammars alike.

        Penalties count the committed tokens here; the drafts before the row are counted on the
        device, where they are drawn (``WarpTable.draft_history``). A grammar's mask depends on
        the drafts themselves: ``grammar_mask`` gives it (the ``min_tokens`` ban folded in)."""
        p = self.params
        history = self.output_ids if p.has_penalties else None
        banned = self.min_tokens_ban if len(self.output_ids) + num_drafts < p.min_tokens and self.grammar is None else []
        return RowParams(p, history, banned)

    def row_mask(self, drafts: list[int], alive: bool) -> torch.Tensor | None:
        """The grammar mask of the row after ``drafts`` (None without a grammar). ``alive``
        False: some draft before it was drawn from an empty q (the grammar left the draft head
        nothing); verification rejects that draft, so this row is never used and must not be
        asked of the grammar (the drafts after it are arbitrary): nothing is allowed."""
        if self.grammar is None:
            return None
        if not alive:
            return torch.zeros(self.grammar.vocab_size, dtype=torch.bool)
        return self.grammar_mask(drafts)

    def grammar_mask(self, drafts: list[int]) -> torch.Tensor:
        """Bool ``[V]``: what the grammar allows after the committed tokens plus ``drafts``,
        less the ``min_tokens`` ban unless the grammar allows only the end there (it wins)."""
        assert self.grammar is not None
        allowed = self.grammar.mask(drafts)
        if len(self.output_ids) + len(drafts) < self.params.min_tokens and self.min_tokens_ban:
            rest = allowed.clone()
            rest[self.min_tokens_ban] = False
            if rest.any():
                allowed = rest
        return allowed

    def take_prompt_logprobs(self) -> list[TokenLogprob | None] | None:
        """The whole prompt's log-probabilities (the first token's ``None``) the first time the
        request emits a delta after its prefill, if it asked for them; else None."""
        if self.params.prompt_logprobs is None or self.prompt_logprobs_sent:
            return None
        self.prompt_logprobs_sent = True
        return [None, *self.prompt_logprobs]

    def add_text(self, ids: list[int], sources: list[str]) -> tuple[str, int | None, list[TextPiece] | None]:
        """Detokenize committed tokens: ``(delta, n_kept, pieces)``, ``n_kept`` as the detokenizer's
        (a stop string ended the text at that token), ``pieces`` the delta by source when the
        request asked for provenance (None otherwise)."""
        if self.provenance is None:
            return (*self.detokenizer.add(ids), None)
        return self.provenance.add(self.detokenizer, ids, sources)

    def flush_text(self, last_source: str) -> tuple[str, list[TextPiece] | None]:
        """The text held back at the end (no stop string ended it), as ``add_text`` gives it."""
        if self.provenance is None:
            return self.detokenizer.flush(), None
        return self.provenance.flush(self.detokenizer, last_source)

    def stream_ahead(self) -> random.Random:
        """A copy of the request's own random stream for one step to draw its uniforms from (on
        the host, uploaded with the step): a seeded request draws the same numbers whatever
        shares its batch, on any device. The request's stream itself moves on only when the
        step commits (``commit_draws``), so a step that fails and runs again (a bisected batch)
        draws the same numbers again."""
        ahead = random.Random.__new__(random.Random)  # not seeded from the OS (~30 us): setstate sets it all
        ahead.setstate(self.generator.getstate())  # ~20 us in all per sampled request and step
        return ahead

    def commit_draws(self, ahead: random.Random | None) -> None:
        """The committed step's draws are spent: continue from the stream it drew from (None: it
        drew nothing)."""
        if ahead is not None:
            self.generator = ahead

    @property
    def takes_tree(self) -> bool:
        """Whether its drafts may be a token tree (``draft_tree``): not with a grammar (its masks
        follow one chain of drafts) or log-probabilities (read from the chain's rows)."""
        return self.grammar is None and self.params.logprobs is None

    @property
    def seeded(self) -> bool:
        """A sampled request with its own seed: its draws, and so its speculation depth, must not
        depend on the batch."""
        return self.params.seed is not None and not self.params.greedy

    def token_stop(self, new: list[int], eos_ids: set[int], max_model_len: int) -> tuple[list[int], FinishReason | None]:
        """``new`` cut at the first token-level stop: EOS / stop ids, max_tokens, max_model_len."""
        p = self.params
        if p.max_tokens == 0:
            return [], "length"  # the prompt was only to be scored
        for i, t in enumerate(new):
            if t in p.stop_token_ids or (not p.ignore_eos and t in eos_ids):
                return new[: i + 1], "stop"
            if len(self.output_ids) + i + 1 >= p.max_tokens or self.num_tokens + i + 1 >= max_model_len:
                return new[: i + 1], "length"
        return new, None

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
