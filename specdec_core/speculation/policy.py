"""How much to speculate this step: per request, which proposer and how many drafts (maybe none).

The model. A request that verifies k drafts commits on average ``E(k)`` tokens: for the draft
model, with per-token acceptance alpha, ``1 + alpha + ... + alpha^k``; for a lookup, the target's
token plus each draft's chance of being kept, from the evidence the lookup found for it
(``lookup_calibration``: a 4-token n-gram match is not a 1-token one). A decode step of requests with drafts ``k_i``
costs ``target(sum(1 + k_i)) + sum_j draft(#requests drafting a j-th token)`` (n-gram and suffix
lookups cost no draft forward), from the measured ``StepCostModel``, every row priced with its
request's cached tokens (at 2K tokens a row of the 1.5B costs ~6 ms more here than at the
calibration's 128). The policy picks the ``k_i`` that maximise
``sum E / cost``: committed tokens per second of the step. With one request and good proposals
that is deep speculation; with many requests, where 16 x 5 tokens cost 4x 16 x 1, it is plain
decoding, by itself.

Exactness does not depend on any of this (every k is lossless). Reproducibility does: a seeded
sampled request draws one uniform per draft and per verified position from its own generator,
so its k must not depend on what else is running. Those requests get ``solo_k`` (their own
history and the start-up costs only); everyone else gets the batch-level optimum.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from specdec_core.speculation.acceptance import Source, expected_tokens
from specdec_core.speculation.draft_tree import DraftTree, Lookup
from specdec_core.speculation.lookup_calibration import LookupCalibration
from specdec_core.speculation.scheduled_request import ScheduledItems, ScheduledRequest, SpeculatingRequest
from specdec_core.speculation.step_costs import StepCostModel


class LookupProposer(Protocol):
    """A proposer that runs no model (n-gram, suffix): its drafts are a function of the text it
    has seen, and its q is one-hot on them."""

    def propose(self, req: SpeculatingRequest, cap: int) -> Lookup:
        """Up to ``cap`` drafts for ``req`` (fewer, or none, where it has no confident match), a
        chain or a token tree (``draft_tree``; cap counts verified rows either way), and the
        drafts it would give for any smaller k (``Lookup.cut``), so it is asked once a step."""
        ...

PROBE_INTERVAL = 32  # a draft model that never pays drafts one token every this many steps
# The rows that drafts add to a step are priced this much above the table: a step's draft rows
# are a bet on the table's slope, and under sustained load the slope is dearer than the
# calibration timed it (the fastest of its rounds). On the 2-core AMD EPYC Zen 4, 8 streams of
# code_edit drafted in 32-row steps the table priced at 251 ms and that took 315, and the drafting
# arm ran at 0.885x the plain one; a few percent of predicted gain is inside that error.
DRAFT_ROW_PREMIUM = 0.25

@dataclass
class _Choice:
    """One request's option: its source, and ``expected[k]``, the tokens a pass verifying k of
    its drafts commits on average, for k up to its cap."""

    item: ScheduledRequest[SpeculatingRequest]
    source: Source
    expected: list[float]
    k: int = 0
    fixed: bool = False
    lookup: Lookup | None = None  # a lookup's, cut to the chosen k for the step (None: the draft model)

    @property
    def cap(self) -> int:
        return len(self.expected) - 1

    @property
    def context(self) -> int:
        """Cached tokens each of its rows attends to (the rows' own cost grows with them)."""
        return self.item.request.num_computed

    @property
    def lag(self) -> int:
        """Tokens the draft cache must catch up beyond the one every draft step feeds."""
        r = self.item.request
        return max(r.num_computed + self.item.num_new - r.draft_computed - 1, 0) if self.source == "draft" else 0

    @property
    def catch_up_rows(self) -> float:
        """The catch-up's share charged to this step. It serves every later step that drafts, so
        it is spread over the steps the request has left (its remaining tokens at E(cap)
        per step); charging it whole to one step would keep a request that fell behind in a full
        batch from ever drafting again once it runs alone."""
        r = self.item.request
        remaining = max(r.params.max_tokens - len(r.output_ids), 1)
        return self.lag * min(1.0, self.expected[self.cap] / remaining)


class SpeculationPolicy:
    """Sets ``num_drafts`` and ``source`` on the decoding items of a scheduled step."""

    def __init__(self, method: str, costs: StepCostModel, adaptive: bool, max_model_len: int,
                 lookups: dict[Source, LookupProposer], has_draft: bool = True) -> None:
        """``lookups``: the method's lookup proposers by source, each asked once a step what it
        has for a request; the chosen one's drafts, cut to the chosen k, are what the step
        verifies (``ScheduledRequest.looked_up``). ``has_draft``: whether a draft model runs
        (``auto`` without one chooses among the lookups only)."""
        self.method = method
        self.has_draft = has_draft
        self.costs = costs
        self.adaptive = adaptive
        self.max_model_len = max_model_len
        self.lookups = lookups
        self.calibration = LookupCalibration()  # fed by the commit (``learn``)

    def learn(self, item: ScheduledRequest[SpeculatingRequest], committed: list[int]) -> None:
        """What one verify pass teaches the lookups' calibration: each lookup made for ``item``,
        chosen or not, against the tokens the pass ``committed`` (the request's own estimates
        learn from the same pass, in ``Request.learn``)."""
        self.calibration.score_all(item.lookups.values(), committed)

    def plan(self, items: ScheduledItems) -> None:
        filling = self.adaptive and any(it.request.in_prefill for it in items)
        capped = [(it, cap) for it in items if (cap := self._cap(it)) > 0]
        plain = self._nothing_can_pay(capped, filling)
        if plain:  # the search would choose k = 0 for all: ask only whoever a probe may draft for
            capped = [(it, cap) for it, cap in capped if _probe_pass(it.request)]
        choices = [c for c in (self._choice(it, cap, filling) for it, cap in capped) if c is not None]
        if not choices:
            return
        free = []
        for c in choices:
            if not self.adaptive:
                c.k = c.cap
            elif c.item.request.seeded:
                c.k, c.fixed = self.solo_k(c), True
            else:
                free.append(c)
        if free and not plain:
            self._optimise(choices, free)
        for c in choices:
            if c.k == 0 and self.adaptive and not c.fixed and self._probe_due(c):
                c.k = 1
            c.item.num_drafts = c.k
            c.item.source = c.source if c.k else None
            # What a lookup at k gives: the step verifies it, and a bisected step's halves again.
            c.item.looked_up = c.lookup.cut(c.k) if c.k and c.lookup is not None else None

    # ------------------------------------------------------------------ one request

    def _cap(self, item: ScheduledRequest[SpeculatingRequest]) -> int:
        """The most drafts ``item`` may verify this step (0: none, it feeds a prompt chunk)."""
        req = item.request
        if not item.completes or self.method == "none":
            return 0
        return min(req.max_spec_tokens, req.params.max_tokens - len(req.output_ids), self.max_model_len - req.num_tokens)

    def _draft_offered(self, item: ScheduledRequest[SpeculatingRequest], filling: bool) -> bool:
        """Whether the draft model is one of ``item``'s options this step (see ``_choice``)."""
        return (self.method in ("draft", "auto") and self.has_draft
                and not (filling and item.request.draft_computed == 0))

    def _choice(self, item: ScheduledRequest[SpeculatingRequest], cap: int, filling: bool) -> _Choice | None:
        """The source of ``item``'s drafts and their ``cap`` (> 0), or None. ``filling``: a
        prompt is prefilled this step (adaptive only), so the batch is still growing."""
        req = item.request
        options: list[_Choice] = []
        for source, proposer in self.lookups.items():
            if self.method not in (source, "auto"):
                continue
            # A completing item has every known token, so the lookup sees the full text.
            found = proposer.propose(req, cap)
            if len(found.tree):
                item.lookups[source] = found.tree
                options.append(_Choice(item, source, self._lookup_expected(req, source, found.tree), lookup=found))
        # The draft model never starts on a request (its cache empty: one forward over all its
        # tokens) in a step that prefills a prompt. Requests come in bursts (a client's concurrent
        # calls, an agent's parallel tool calls): the first of a burst is prefilled alone and
        # the rest in the next step, beside its first decode. Priced as the one decoding stream
        # it then is, it took the draft model and caught up its whole prompt (~0.3 s for 48
        # tokens of the 0.5B here) just before a batch of four in which the draft never pays,
        # once in every burst. Once no prompt is filling, the policy prices the batch as it is;
        # a request that really runs alone gives up one or two steps' drafts.
        if self._draft_offered(item, filling):
            options.append(_Choice(item, "draft", _geometric(req.alpha("draft"), cap)))
        if len(options) <= 1:
            return options[0] if options else None
        # auto with a match: the proposer that pays more for this request alone
        target = self._solo_target(cap, options[0].context)  # one price list for every option
        return max(options, key=lambda c: max(self._solo_rates(c.source, c.expected, c.context, target)))

    def _lookup_expected(self, req: SpeculatingRequest, source: Source, tree: DraftTree) -> list[float]:
        """``E(k)`` of a lookup: from its evidence, priced by the calibration; for a seeded
        request (whose k must not depend on other requests, ``solo_k``) or a lookup without
        evidence, from the request's own acceptance of the source."""
        if req.seeded or not tree.evidence:
            return _geometric(req.alpha(source), len(tree))
        return self.calibration.expected(tree)

    def solo_k(self, c: _Choice) -> int:
        """k from the request's own history and the start-up costs: independent of the batch."""
        k = self._solo_best(c.source, c.expected, c.context)
        if k == 0 and self._probe_due(c):
            return 1
        return k

    def _solo_best(self, source: Source, expected: list[float], context: int) -> int:
        rates = self._solo_rates(source, expected, context, self._solo_target(len(expected) - 1, context))
        return max(range(len(rates)), key=rates.__getitem__)

    def _solo_target(self, cap: int, context: int) -> list[float]:
        """The target's forward of one request alone verifying k = 0..``cap`` drafts, from the
        start-up costs (what every source of the request pays alike, so priced once for all)."""
        return [self._target(1 + k, (1 + k) * context, context, 1, frozen=True) for k in range(cap + 1)]

    def _solo_rates(self, source: Source, expected: list[float], context: int, target: list[float]) -> list[float]:
        """Tokens per second of the request alone at each k, ``target`` its forwards' prices."""
        draft = self.costs.draft(1, frozen=True, context_tokens=context) if source == "draft" else 0.0
        return [expected[k] / (target[k] + k * draft) for k in range(len(expected))]

    def _probe_due(self, c: _Choice) -> bool:
        """A draft model that does not pay for a request keeps learning: one draft every
        ``PROBE_INTERVAL`` of its verify passes, only while even alone it would choose none.
        Lookups need no probe: every pass scores them, chosen or not (``Request.learn``).
        The draft model is probed only where its cache is current (``lag`` 0): a probe that
        first catches the cache up is one eager forward over every token
        since the draft last ran, measured on an H100 at 100-140 ms, 20-30 decode steps
        (``clients/tools/cuda_check.py``), which no single probed token repays. The lag is the
        request's own history, so a seeded request's k stays independent of the batch."""
        return (c.source == "draft" and c.lag == 0
                and _probe_pass(c.item.request)
                and self._solo_best(c.source, c.expected, c.context) == 0)

    # ------------------------------------------------------------------ the batch

    def _optimise(self, choices: list[_Choice], free: list[_Choice]) -> None:
        """Best ``k`` for the free choices, the fixed ones as given: a sweep of one common depth,
        then single-request moves while any improves the step's tokens per second."""
        best_rate = self._rate(choices)
        if not self._could_pay(choices, free, best_rate):
            return
        best_ks = [c.k for c in free]
        for depth in range(1, max(c.cap for c in free) + 1):
            for c in free:
                c.k = min(depth, c.cap)
            rate = self._rate(choices)
            if rate > best_rate:
                best_rate, best_ks = rate, [c.k for c in free]
        for c, k in zip(free, best_ks):
            c.k = k
        for _ in range(2):
            improved = False
            for c in free:
                for step in (1, -1):
                    k = c.k + step
                    if not 0 <= k <= c.cap:
                        continue
                    old, c.k = c.k, k
                    rate = self._rate(choices)
                    if rate > best_rate * (1 + 1e-9):
                        best_rate, improved = rate, True
                        break
                    c.k = old
            if not improved:
                break

    def _could_pay(self, choices: list[_Choice], free: list[_Choice], rate: float) -> bool:
        """Whether any drafts for the free choices (all at k = 0 here) could beat ``rate``, by an
        upper bound: ``extra`` more rows commit at most ``extra * gain_max`` more tokens (no
        draft adds more than the likeliest first one, ``expected[1] - 1``) and cost
        at least the target's forward at those rows as ``_rate`` prices it (the premium
        included), each new row at the smallest free context (the table never falls with rows
        or context), and no draft forward. Where it says no, the
        search (~2 ms a step at 16 streams on the CPU, in Python) is skipped: its answer would
        have been all zeros."""
        gain_max = max(c.expected[1] - 1 for c in free)
        least_context = min(c.context for c in free)
        tokens, rows, context, requests = _verify_totals(choices)
        for extra in range(1, sum(c.cap for c in free) + 1):
            seconds = self._target(rows + extra, context + extra * least_context, requests, len(choices))
            if seconds <= 0 or (tokens + extra * gain_max) / seconds > rate * (1 + 1e-9):
                return True
        return False

    def _nothing_can_pay(self, capped: list[tuple[ScheduledRequest[SpeculatingRequest], int]], filling: bool) -> bool:
        """Whether no draft of any source can pay this step, decided before any lookup: where
        ``_could_pay`` says no for drafts that are all kept (a draft adds at most one token) and
        cost no draft forward, it says no for whatever the lookups and the draft model offer, and
        the search would choose k = 0 throughout. At 8 streams of the 1.5B on the 2-core CPU a
        draft row at its premium costs about a request's share of the plain step, so in about
        half the steps not even a kept draft pays, and ``plan`` took 1.1-1.9 ms a step there,
        lookups made only to be passed over. A skipped step makes no lookup, so none is scored:
        the requests' and the calibration's estimates keep what they had. Only where the bound
        covers exactly the batch the search would price: every capped request has a choice
        whatever its lookups find (the draft model is offered to it), and none is seeded (their k
        is their own)."""
        if not self.adaptive or not capped:
            return False
        if any(it.request.seeded or not self._draft_offered(it, filling) for it, _ in capped):
            return False
        certain = [_Choice(it, "ngram", [1.0 + j for j in range(cap + 1)]) for it, cap in capped]
        return not self._could_pay(certain, certain, self._rate(certain))

    def _target(self, rows: int, context: float, requests_context: float, requests: int, frozen: bool = False) -> float:
        """The target's forward of ``rows`` rows from ``requests`` requests, the rows' cached
        tokens ``context`` in all and the requests' ``requests_context``: the table's price of one
        row a request, and what the other rows (drafts) add at ``1 + DRAFT_ROW_PREMIUM`` times its price."""
        plain = self.costs.target(requests, frozen, context_tokens=requests_context, request_context=requests_context)
        if rows <= requests:
            return plain
        full = self.costs.target(rows, frozen, context_tokens=context, request_context=requests_context)
        return plain + (1.0 + DRAFT_ROW_PREMIUM) * max(full - plain, 0.0)

    def _rate(self, choices: list[_Choice]) -> float:
        tokens, rows, context, requests = _verify_totals(choices)
        seconds = self._target(rows, context, requests, len(choices))
        depth = max((c.k for c in choices if c.source == "draft"), default=0)
        for j in range(1, depth + 1):
            # The first draft forward also catches up lagging draft caches (counted as rows).
            drafting = [(1 + (c.catch_up_rows if j == 1 else 0), c.context) for c in choices
                        if c.source == "draft" and c.k >= j]
            seconds += self.costs.draft(sum(n for n, _ in drafting),
                                        context_tokens=sum(n * ctx for n, ctx in drafting))
        return tokens / seconds if seconds > 0 else 0.0


def _verify_totals(choices: list[_Choice]) -> tuple[float, int, int, int]:
    """The step's expected committed tokens, its verified rows, their cached tokens in all, and
    its requests' cached tokens (once a request: its rows read its keys together)."""
    return (sum(c.expected[c.k] for c in choices), sum(1 + c.k for c in choices),
            sum((1 + c.k) * c.context for c in choices), sum(c.context for c in choices))


def _probe_pass(req: SpeculatingRequest) -> bool:
    """Whether this verify pass is one at which ``_probe_due`` may draft a probe."""
    return req.stats.verify_steps % PROBE_INTERVAL == PROBE_INTERVAL - 1


def _geometric(alpha: float, cap: int) -> list[float]:
    """``E(k)`` for k = 0..cap where every draft is kept with ``alpha`` once its parent was."""
    return [expected_tokens(alpha, k) for k in range(cap + 1)]
