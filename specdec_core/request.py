"""A request's life inside the engine: its tokens, its cache positions in both models, its
sampling state and its statistics."""

from __future__ import annotations

import enum
import time
from typing import TYPE_CHECKING

import torch

from .detokenizer import IncrementalDetokenizer
from .outputs import FinishReason, RequestStats
from .sampling_params import SamplingParams
from .speculation_policy import PRIOR, AcceptanceEstimate

if TYPE_CHECKING:
    from .proposer import NgramIndex


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
        generator: torch.Generator,
        detokenizer: IncrementalDetokenizer,
        max_spec_tokens: int,
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
        self.slot: int | None = None
        self.status = Status.WAITING
        self.finish_reason: FinishReason | None = None
        self.error: str | None = None
        self.stats = RequestStats(prompt_tokens=len(prompt_ids), arrival_time=time.monotonic())
        # This request's own acceptance per proposer, for the speculation policy.
        self.acceptance = {source: AcceptanceEstimate(prior) for source, prior in PRIOR.items()}
        # Prompt-lookup index over all_ids, for the n-gram proposer (None when it is not used).
        self.ngram: NgramIndex | None = None

    @property
    def in_prefill(self) -> bool:
        return self.num_computed < len(self.prompt_ids)

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
