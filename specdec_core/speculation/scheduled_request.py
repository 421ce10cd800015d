"""One request's share of a step (``ScheduledRequest``) and what speculation reads of a request
(``SpeculatingRequest``).

Both live here, below the engine, so speculation never imports the engine: the policy, the
proposers and the cost model read a request through the protocol, and the engine's ``Request``
satisfies it. ``ScheduledRequest`` is generic in the request type, so the engine, which
schedules its own ``Request``, keeps reading every attribute of it with full types.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, Protocol, TypeAlias, TypeVar

from specdec_core.speculation.acceptance import Source
from specdec_core.speculation.draft_tree import DraftTree

if TYPE_CHECKING:  # types only: the protocol names them, calls nothing in their modules
    import torch

    from specdec_core.decoding.grammar import GrammarState
    from specdec_core.decoding.sampling import RowParams
    from specdec_core.decoding.sampling_params import SamplingParams
    from specdec_core.speculation.ngram_index import NgramIndex
    from specdec_core.speculation.suffix_trie import SuffixIndex


class VerifyCounts(Protocol):
    """The one counter the policy reads of a request's statistics (probes are timed by it)."""

    @property
    def verify_steps(self) -> int: ...


class SpeculatingRequest(Protocol):
    """What the policy, the proposers and the cost model read of a request (read-only: the
    commit moves it). Members are properties, so a plain attribute of the request satisfies them."""

    @property
    def params(self) -> SamplingParams: ...
    @property
    def prompt_ids(self) -> list[int]: ...
    @property
    def all_ids(self) -> list[int]: ...
    @property
    def output_ids(self) -> list[int]: ...
    @property
    def num_computed(self) -> int: ...
    @property
    def draft_computed(self) -> int: ...
    @property
    def num_tokens(self) -> int: ...
    @property
    def in_prefill(self) -> bool: ...
    @property
    def seeded(self) -> bool: ...
    @property
    def takes_tree(self) -> bool: ...
    @property
    def max_spec_tokens(self) -> int: ...
    @property
    def blocks(self) -> list[int]: ...
    @property
    def grammar(self) -> GrammarState | None: ...
    @property
    def ngram(self) -> NgramIndex | None: ...
    @property
    def suffix(self) -> SuffixIndex | None: ...
    @property
    def stats(self) -> VerifyCounts: ...

    def alpha(self, source: Source) -> float: ...

    def row_params(self, num_drafts: int) -> RowParams: ...

    def row_mask(self, drafts: list[int], alive: bool) -> torch.Tensor | None: ...


R = TypeVar("R", bound=SpeculatingRequest, covariant=True)


@dataclass
class ScheduledRequest(Generic[R]):
    """One request's share of a step: ``num_new`` known tokens fed to the target (a prompt chunk,
    or the last generated token) and ``num_drafts`` speculative tokens after them, proposed by
    ``source``. The scheduler fills ``num_new``, the speculation policy ``num_drafts``,
    ``source``, ``looked_up`` and ``lookups``; proposers, the forward and the commit only read it."""

    request: R
    num_new: int
    num_drafts: int = 0
    source: Source | None = None
    # A lookup source's drafts as the policy chose them (what a lookup at ``num_drafts`` gives,
    # ``Lookup.cut``; None for the draft model's or none): the step verifies these, so the
    # proposer is asked once a step, and the drafts verified are the ones the policy priced.
    looked_up: DraftTree | None = None
    # Every lookup the policy made for this request this step, chosen or not: the commit scores
    # each against the tokens it commits (``Request.learn``, ``LookupCalibration.score``).
    lookups: dict[Source, DraftTree] = field(default_factory=dict)

    @property
    def completes(self) -> bool:
        """True when every known token is in the cache after this step: logits are needed."""
        return self.request.num_computed + self.num_new == self.request.num_tokens

    @property
    def prompt_rows(self) -> int:
        """Rows of this step whose logits score the next prompt token, for a request that asks for
        prompt log-probabilities: every prompt position fed now but the prompt's last (its logits
        start the answer, as for every request). 0 for everyone else: they pay nothing."""
        r = self.request
        if r.params.prompt_logprobs is None or not r.in_prefill:
            return 0
        return max(min(r.num_computed + self.num_new, len(r.prompt_ids) - 1) - r.num_computed, 0)  # 0: recomputing output


# A step's items as speculation reads them: any request type that satisfies the protocol (a
# Sequence, since a list of the engine's items is not a list of protocol items).
ScheduledItems: TypeAlias = Sequence[ScheduledRequest[SpeculatingRequest]]
