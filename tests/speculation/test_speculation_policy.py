"""The speculation policy: how many drafts each request gets, from measured costs and its own
acceptance; and 'auto' staying exact."""

from __future__ import annotations

import random

import pytest
import torch

from specdec_core import Engine, EngineConfig, SamplingParams
from specdec_core.engine.request import Request
from specdec_core.speculation.acceptance import expected_tokens
from specdec_core.speculation.cost_table import CostTable
from specdec_core.speculation.draft_tree import DraftTree, Lookup
from specdec_core.speculation.policy import DRAFT_ROW_PREMIUM, PROBE_INTERVAL, SpeculationPolicy
from specdec_core.speculation.scheduled_request import ScheduledRequest
from specdec_core.speculation.step_costs import StepCostModel
from tests.helpers.models import load

# Step costs measured on the 2-core CPU (ms): the 1.5B int8 target by tokens in the step, the
# 0.5B int8 draft by requests in one draft forward (clients/tools/step_costs.py).
CPU_COSTS = StepCostModel(CostTable([1, 2, 5, 16, 80], [54.0, 55.0, 57.7, 101.6, 445.0]),
                          CostTable([1, 4, 16], [20.0, 26.0, 48.0]))


class RepeatLookup:
    """An n-gram proposer whose lookup always finds ``token`` repeated: the policy's input without
    building a text that repeats itself."""

    def __init__(self, token: int) -> None:
        self.token = token

    def lookup(self, req: Request, k: int) -> list[int]:
        return [self.token] * k

    def propose(self, req: Request, cap: int) -> Lookup:
        return Lookup(DraftTree.chain(self.lookup(req, cap)))


class ShortLookup(RepeatLookup):
    """A lookup that finds at most ``found`` tokens."""

    def __init__(self, token: int, found: int) -> None:
        super().__init__(token)
        self.found = found

    def lookup(self, req: Request, k: int) -> list[int]:
        return [self.token] * min(k, self.found)


def request(alpha: float, *, seed: int | None = None, temperature: float = 0.0, k: int = 4,
            source: str = "draft", context: int = 2) -> Request:
    """A decoding request: ``context`` tokens cached (its prompt), its first token to feed."""
    params = SamplingParams(max_tokens=100, temperature=temperature, seed=seed)
    prompt = [1, 2] + [3] * (context - 2)
    req = Request("r", prompt, params, torch.Generator().manual_seed(0), None, k)  # type: ignore[arg-type]
    req.output_ids, req.all_ids = [3], prompt + [3]
    req.num_computed = context
    est = req.acceptance[source]
    est.successes, est.trials = alpha * 100, 100.0
    return req


def priced(costs: StepCostModel, rows: int, requests: int, context: int | None = None) -> float:
    """The target's forward as the policy prices it: one row a request at the table's price, the
    other (draft) rows at ``1 + DRAFT_ROW_PREMIUM`` times theirs; ``context``: each request's
    cached tokens (None: the table's own)."""
    def table(n: int) -> float:
        if context is None:
            return costs.target(n)
        return costs.target(n, context_tokens=n * context, request_context=requests * context)
    return table(requests) + (1 + DRAFT_ROW_PREMIUM) * (table(rows) - table(requests))


def plan(requests: list[Request], costs: StepCostModel = CPU_COSTS, method: str = "draft",
         lookup: RepeatLookup | None = None) -> list[int]:
    items = [ScheduledRequest(r, 1) for r in requests]
    policy = SpeculationPolicy(method, costs, adaptive=True, max_model_len=4096, lookups={"ngram": lookup or RepeatLookup(5)})  # type: ignore[dict-item]
    policy.plan(items)
    return [it.num_drafts for it in items]


class CountedLookup(ShortLookup):
    """A lookup that counts the requests it was asked for."""

    def __init__(self, token: int, found: int = 1 << 20) -> None:
        super().__init__(token, found)
        self.asked = 0

    def propose(self, req: Request, cap: int) -> Lookup:
        self.asked += 1
        return super().propose(req, cap)


def test_one_request_with_good_drafts_speculates_and_poor_drafts_do_not():
    assert plan([request(0.9)]) == [4]
    assert plan([request(0.1)]) == [0]


def test_many_requests_fall_back_to_plain_decoding_where_batched_drafts_cost_more():
    # 16 x 5 tokens cost 4.4x 16 x 1 here: even at alpha 0.7 plain decoding commits more per second.
    assert plan([request(0.7) for _ in range(16)]) == [0] * 16
    # A target whose batched drafts are almost free (a GPU) keeps speculating.
    flat = StepCostModel(CostTable([1, 80], [10.0, 12.0]), CostTable([1, 16], [1.0, 1.2]))
    assert all(k > 0 for k in plan([request(0.7) for _ in range(16)], flat))


def test_the_choice_maximises_the_modelled_rate():
    """Against exhaustive search on two requests: the policy's k's are as good as the best."""
    reqs = [request(0.85), request(0.4)]
    ks = plan(reqs)

    def rate(k0: int, k1: int) -> float:
        tokens = expected_tokens(0.85, k0) + expected_tokens(0.4, k1)
        seconds = priced(CPU_COSTS, 2 + k0 + k1, 2) + sum(
            CPU_COSTS.draft((k0 >= j) + (k1 >= j)) for j in range(1, max(k0, k1) + 1))
        return tokens / seconds

    best = max(rate(a, b) for a in range(5) for b in range(5))
    assert rate(*ks) == pytest.approx(best, rel=1e-9)


def test_skipping_the_search_where_no_draft_can_pay_changes_no_choice(monkeypatch):
    """The policy skips its search, and before it the lookups, where an upper bound says no
    draft can pay. Over random batches (sources, acceptances, contexts below and above
    calibration's, a CPU's and a GPU's costs, seeded requests, probe passes, auto and a
    lookup-only method) it must choose exactly what the full search chooses, and it must really
    skip both."""
    rng = random.Random(23)
    costs = [StepCostModel(CostTable([1, 2, 5, 16, 80], [54.0, 55.0, 57.7, 101.6, 445.0],
                                     per_context=11.0 / 1024, context=128),
                           CostTable([1, 4, 16], [20.0, 26.0, 48.0], per_context=2.0 / 1024, context=128)),
             StepCostModel(CostTable([1, 80], [10.0, 12.0]), CostTable([1, 16], [1.0, 1.2]))]
    skipped, drafted = 0, 0
    calls = {"skips": 0}
    bound = SpeculationPolicy._could_pay

    def counted(self, *args):  # type: ignore[no-untyped-def]
        could = bound(self, *args)
        calls["skips"] += not could
        return could

    unasked = 0  # batches planned without a lookup for some request
    for case in range(300):
        top = rng.choice([0.1, 0.3, 0.6, 1.0])  # the batch's best acceptance
        contexts = [2, 40, 128, 900, 3000]
        if rng.random() < 0.5:  # a batch of one length (where at 16 streams not even kept drafts pay)
            contexts = [rng.choice(contexts)]
        specs = [(top * rng.random(), rng.choice(["draft", "ngram"]), rng.choice(contexts))
                 for _ in range(rng.choice([1, 2, 4, 8, 16]))]
        cost = costs[case % 2]
        reqs = [request(a, source=s, context=c, seed=1 if rng.random() < 0.02 else None,
                        temperature=0.0 if rng.random() < 0.98 else 0.7) for a, s, c in specs]
        for r in reqs:  # the other proposer's estimate, from as much evidence
            other = r.acceptance["ngram" if r.acceptance["draft"].trials == 100.0 else "draft"]
            other.successes, other.trials = top * rng.random() * 100, 100.0
            if rng.random() < 0.1:  # at its draft probe's pass, its draft cache current
                r.stats.verify_steps, r.draft_computed = PROBE_INTERVAL - 1, r.num_computed
        method = rng.choice(["auto", "auto", "ngram"])
        monkeypatch.setattr(SpeculationPolicy, "_could_pay", counted)
        before, lookup = calls["skips"], CountedLookup(5)
        pruned = plan(reqs, cost, method, lookup)
        monkeypatch.setattr(SpeculationPolicy, "_could_pay", lambda self, *args: True)
        assert pruned == plan(reqs, cost, method), (case, specs)
        skipped += calls["skips"] > before
        drafted += any(pruned)
        unasked += lookup.asked < len(reqs)
    assert skipped > 20 and drafted > 20 and unasked > 10, (skipped, drafted, unasked)


def test_where_no_draft_can_pay_no_lookup_is_made():
    """16 streams on the CPU: a draft row at its premium costs more than a request's share of
    the plain step, so not even a draft that is surely kept pays. The policy decides so before
    any lookup, and looks up only for the requests whose k does not depend on the batch (a
    seeded one, which must get its own k) or that may draft a probe."""
    lookup = CountedLookup(5)
    assert plan([request(0.9, source="ngram") for _ in range(16)], CPU_COSTS, "auto", lookup) == [0] * 16
    assert lookup.asked == 0
    probed = request(0.02)  # the draft model does not pay for it even alone, and no lookup finds anything
    probed.stats.verify_steps, probed.draft_computed = PROBE_INTERVAL - 1, probed.num_computed
    lookup = CountedLookup(5, found=0)
    assert plan([probed] + [request(0.9) for _ in range(15)], CPU_COSTS, "auto", lookup) == [1] + [0] * 15
    assert lookup.asked == 1
    seeded = request(0.9, source="ngram", seed=3, temperature=0.7)
    lookup = CountedLookup(5)
    plan([seeded] + [request(0.9, source="ngram") for _ in range(15)], CPU_COSTS, "auto", lookup)
    assert lookup.asked == 16
    # Alone, the same request drafts: the lookup is made.
    lookup = CountedLookup(5)
    assert plan([request(0.9, source="ngram")], CPU_COSTS, "auto", lookup) == [4] and lookup.asked == 1


def test_long_contexts_make_rows_dearer_and_the_choice_follows():
    """Each row attends to its own cached tokens: at 3,000 of them a row of the 1.5B costs ~3x
    what calibration's 128 gave, so the same acceptance pays for fewer drafts; the choice is the
    best one under the costs with context (exhaustive search over one request)."""
    costs = StepCostModel(CostTable([1, 2, 5, 16, 80], [54.0, 55.0, 57.7, 101.6, 445.0],
                                    per_context=11.0 / 1024, context=128), None)
    short, long = request(0.6, source="ngram", context=128), request(0.6, source="ngram", context=3000)
    [k_short], [k_long] = plan([short], costs, "ngram"), plan([long], costs, "ngram")

    def rate(k: int) -> float:
        return expected_tokens(long.alpha("ngram"), k) / priced(costs, 1 + k, 1, 3000)

    assert k_long < k_short == 4
    assert rate(k_long) == pytest.approx(max(rate(k) for k in range(5)), rel=1e-9)


def test_a_requests_drafts_share_its_key_reads_so_long_contexts_still_pay_for_them():
    """A request's rows read its keys once (``CostTable.per_request_context``); each row adds only
    its own work on them. Priced so, at 3,000 cached tokens a request drafts more than where the
    same slope is charged to every row (only its first row pays the reads); at four streams the
    reads are every request's, drafts or not, so they price no draft either. Each choice is the
    best under its costs (exhaustive search)."""
    grid = ([1, 2, 5, 16, 80], [54.0, 55.0, 57.7, 101.6, 445.0])
    shared = StepCostModel(CostTable(*grid, per_context=2.0 / 1024, context=128, per_request_context=9.0 / 1024), None)
    per_row = StepCostModel(CostTable(*grid, per_context=11.0 / 1024, context=128), None)
    short, long = request(0.6, source="ngram", context=128), request(0.6, source="ngram", context=3000)
    assert plan([short], shared, "ngram") == plan([short], per_row, "ngram") == [4]
    [k_shared], [k_row] = plan([long], shared, "ngram"), plan([long], per_row, "ngram")
    assert k_row < k_shared

    alpha = long.alpha("ngram")  # the request's confident estimate, as the policy reads it

    def rate(k: int) -> float:
        return expected_tokens(alpha, k) / priced(shared, 1 + k, 1, 3000)

    assert rate(k_shared) == pytest.approx(max(rate(k) for k in range(5)), rel=1e-9)
    four = [request(0.6, source="ngram", context=3000) for _ in range(4)]
    ks = plan(four, shared, "ngram")

    def batch_rate(k: int) -> float:
        return 4 * expected_tokens(alpha, k) / priced(shared, 4 * (1 + k), 4, 3000)

    assert len(set(ks)) == 1 and ks[0] > 0
    assert batch_rate(ks[0]) == pytest.approx(max(batch_rate(k) for k in range(5)), rel=1e-9)


def test_a_seeded_sampled_request_gets_the_same_k_whatever_else_runs():
    seeded = request(0.8, seed=7, temperature=0.8)
    alone = plan([seeded])
    crowded = plan([seeded] + [request(0.7) for _ in range(15)])
    assert alone[0] > 0 and crowded[0] == alone[0] and crowded[1:] == [0] * 15
    # Live cost corrections (a loaded machine) move everyone else, never the seeded request.
    slow = StepCostModel(CPU_COSTS.target_table, CPU_COSTS.draft_table)
    slow.live_target.seconds = [3 * s for s in slow.live_target.seconds]
    assert plan([seeded], slow) == alone


def test_auto_prefers_a_free_lookup_with_good_acceptance():
    req = request(0.8, source="ngram")
    req.acceptance["draft"].successes, req.acceptance["draft"].trials = 30.0, 100.0
    items = [ScheduledRequest(req, 1)]
    SpeculationPolicy("auto", CPU_COSTS, True, 512, {"ngram": RepeatLookup(9)}).plan(items)  # type: ignore[dict-item]
    assert items[0].source == "ngram"
    assert items[0].num_drafts == 4


def _auto(req: Request, lookups: dict) -> ScheduledRequest:
    items = [ScheduledRequest(req, 1)]
    SpeculationPolicy("auto", CPU_COSTS, True, 512, lookups).plan(items)
    return items[0]


def test_auto_picks_the_suffix_lookup_where_it_pays_more():
    req = request(0.5, source="ngram")
    req.acceptance["suffix"].successes, req.acceptance["suffix"].trials = 90.0, 100.0
    lookups = {"ngram": RepeatLookup(9), "suffix": RepeatLookup(8)}
    assert (_auto(req, lookups).source, _auto(req, lookups).num_drafts) == ("suffix", 4)
    # The same acceptance, but the suffix trie is only confident of one token: n-gram's 4 pay more.
    short = {"ngram": RepeatLookup(9), "suffix": ShortLookup(8, 1)}
    req.acceptance["ngram"].successes = 90.0
    assert _auto(req, short).source == "ngram"
    # No lookup found anything: the draft model.
    assert _auto(req, {"ngram": ShortLookup(9, 0), "suffix": ShortLookup(8, 0)}).source == "draft"


def test_a_lookup_passed_over_keeps_learning_and_is_chosen_again():
    """Every lookup the policy made is scored against what the step committed, chosen or not. A
    lookup that missed early, and was passed over for the draft model, comes back as soon as its
    proposals would have been kept. Before, only verified passes taught a lookup, so auto kept
    the draft model for the rest of a request even where its text had become copyable (issue 23:
    n-gram alone 1.5x auto on code_edit), and a relaxation back to the prior had to re-try it."""
    req = request(0.8)
    lookups = {"ngram": RepeatLookup(9)}
    for _ in range(4):  # the lookup proposed 9s; the target committed 1s
        item = _auto(req, lookups)
        assert item.source == "draft" and item.lookups["ngram"].tokens == [9] * 4
        req.learn(item.source, 0, item.num_drafts, item.lookups, [1])
    assert req.acceptance["ngram"].alpha < 0.15
    passes = 0
    while (item := _auto(req, lookups)).source == "draft":
        # the draft model keeps 3 of 4; the target's tokens are the lookup's 9s
        req.learn("draft", 3, item.num_drafts, item.lookups, [9] * 4)
        passes += 1
    assert item.source == "ngram" and 0 < passes <= 6
    assert req.acceptance["draft"].alpha == pytest.approx(0.8, abs=0.05)


def test_a_lookup_estimate_from_few_passes_is_not_trusted_where_rows_are_dear():
    """At 4 streams a verified row costs ~9% of the step (this table is the 2-core CPU's), ~11%
    with the draft rows' premium, so a draft pays above ~0.45 acceptance. The same mean of 0.6
    drafts when many passes back it and does not from a few: a mean from a handful of passes
    clears the break-even most often where it is too high (chat at 4 streams drafted lookups that
    kept 0.26, 2026-11-27)."""
    costs = StepCostModel(CostTable([1, 4, 5, 6, 8], [70.0, 89.0, 97.0, 105.0, 160.0]), None)

    def drafts(trials: float) -> list[int]:
        reqs = [request(0.0, source="ngram") for _ in range(4)]
        est = reqs[0].acceptance["ngram"]
        est.successes, est.trials = 0.6 * trials, trials
        return plan(reqs, costs, "ngram")

    assert drafts(100.0)[0] > 0
    assert drafts(3.0)[0] == 0
    assert drafts(100.0)[1:] == drafts(3.0)[1:] == [0, 0, 0]


def test_only_the_draft_model_is_probed():
    """A probe buys evidence with a verified row; a lookup gets its evidence free at every pass,
    so where neither pays, at a probe's pass only the draft model drafts its one token."""
    drafted = {}
    for method, lookups in (("draft", {}), ("ngram", {"ngram": RepeatLookup(9)})):
        req = request(0.02, source=method)
        req.draft_computed = req.num_computed  # the draft cache is current: a probe may run
        req.stats.verify_steps = PROBE_INTERVAL - 1
        items = [ScheduledRequest(req, 1)]
        SpeculationPolicy(method, CPU_COSTS, True, 512, lookups).plan(items)  # type: ignore[arg-type]
        drafted[method] = items[0].num_drafts
    assert drafted == {"draft": 1, "ngram": 0}


def test_scoring_a_lookup_counts_what_verifying_it_would_keep():
    from specdec_core.speculation.acceptance import AcceptanceEstimate

    for proposal, committed, outcome in (([5, 6, 7], [5, 6, 8], (2, 3)),  # kept 2, the 3rd rejected
                                         ([5, 6, 7], [5, 6, 7, 4], (3, 3)),  # all kept: no failure
                                         ([5, 6, 7], [5, 6], (2, 2)),  # the rest was never decided
                                         ([5], [4, 1], (0, 1))):
        scored, verified = AcceptanceEstimate(0.5), AcceptanceEstimate(0.5)
        scored.score(proposal, committed)
        verified.update(*outcome)
        assert (scored.successes, scored.trials) == (verified.successes, verified.trials)


def test_the_confident_estimate_is_below_the_mean_and_closes_in_with_evidence():
    from specdec_core.speculation.acceptance import AcceptanceEstimate

    bounds = []
    for trials in (2.0, 10.0, 100.0, 10_000.0):
        est = AcceptanceEstimate(0.5)
        est.successes, est.trials = 0.6 * trials, trials
        assert 0.0 <= est.confident < est.alpha == pytest.approx(0.6)
        bounds.append(est.confident)
    assert bounds == sorted(bounds) and bounds[-1] == pytest.approx(0.6, abs=0.01)


def test_observed_steps_rescale_the_live_costs_only():
    costs = StepCostModel(CostTable([1, 8], [1.0, 2.0]), None)
    for _ in range(200):  # the level learns a doubling in ~50 steps; the size's correction rises, then returns
        costs.observe_target(8, 4.0)
    assert costs.target(8) == pytest.approx(4.0, rel=1e-3)
    assert costs.target(8, frozen=True) == 2.0


# ---------------------------------------------------------------------- the engine with 'auto'

PROMPTS = [
    "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a + b\n\ndef add(",
    "The capital of France is",
    "1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2,",
    "Once upon a time, in a land far away, there lived",
]
GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def pair(tiny_target, tiny_draft):
    return load(tiny_target), load(tiny_draft, role="draft")


@pytest.mark.parametrize("adaptive", [False, True])
def test_auto_greedy_equals_target_only_and_uses_both_proposers(pair, adaptive):
    target, draft = pair
    base = dict(num_speculative_tokens=4, seed=0, max_num_seqs=4)
    alone = Engine.from_loaded(EngineConfig(speculative_method="none", **base), target).generate(PROMPTS, GREEDY)
    eng = Engine.from_loaded(EngineConfig(speculative_method="auto", adaptive_speculation=adaptive, **base),
                             target, draft)
    assert eng.method == "auto"
    assert [c.token_ids for c in eng.generate(PROMPTS, GREEDY)] == [c.token_ids for c in alone]
    if not adaptive:  # every step speculates, so both proposers must have been exercised
        by_source = eng.metrics.draft_tokens_by_source
        assert by_source.get("ngram", 0) > 0 and by_source.get("draft", 0) > 0, by_source


@pytest.mark.parametrize("adaptive", [False, True])
def test_auto_without_a_draft_model_chooses_among_the_lookups(pair, adaptive):
    target, _ = pair
    base = dict(num_speculative_tokens=4, seed=0, max_num_seqs=4)
    alone = Engine.from_loaded(EngineConfig(speculative_method="none", **base), target).generate(PROMPTS, GREEDY)
    eng = Engine.from_loaded(EngineConfig(speculative_method="auto", adaptive_speculation=adaptive, **base), target)
    assert eng.method == "auto" and eng.drafter is None
    assert [c.token_ids for c in eng.generate(PROMPTS, GREEDY)] == [c.token_ids for c in alone]
    by_source = eng.metrics.draft_tokens_by_source
    assert by_source.get("ngram", 0) + by_source.get("suffix", 0) > 0 and "draft" not in by_source, by_source
    assert eng.policy.calibration.scored > 0  # the commit taught the lookups' calibration
    # Nothing to look up: no draft-model choice to fall back on, so no drafts at all.
    req = request(0.9, source="ngram")
    assert _auto_without_draft(req, {"ngram": ShortLookup(9, 0), "suffix": ShortLookup(8, 0)}).num_drafts == 0


def _auto_without_draft(req: Request, lookups: dict) -> ScheduledRequest:
    items = [ScheduledRequest(req, 1)]
    SpeculationPolicy("auto", StepCostModel(CPU_COSTS.target_table, None), True, 512, lookups, has_draft=False).plan(items)
    return items[0]


def test_a_reduced_draft_head_proposes_only_its_tokens_and_stays_exact(pair):
    target, draft = pair
    base = dict(num_speculative_tokens=3, seed=0, adaptive_speculation=False, max_num_seqs=4)
    alone = Engine.from_loaded(EngineConfig(speculative_method="none", **base), target).generate(PROMPTS, GREEDY)
    eng = Engine.from_loaded(EngineConfig(speculative_method="draft", draft_vocab_size=2000, **base), target, draft)
    assert [c.token_ids for c in eng.generate(PROMPTS, GREEDY)] == [c.token_ids for c in alone]
    from specdec_core.execution.forward_plan import ForwardItem

    logits = eng.draft_runner.forward([ForwardItem([0], 0, [1, 2, 3], 1)])[0]
    scored = torch.isfinite(logits).nonzero().flatten().tolist()
    assert scored[:2000] == list(range(2000)) and set(scored[2000:]) <= eng.eos_ids | set(
        eng.tokenizer.all_special_ids)


def test_a_lagging_draft_cache_is_charged_to_the_steps_it_serves():
    fresh, lagging, ending = request(0.9), request(0.9), request(0.9)
    for req in (lagging, ending):
        req.all_ids = list(range(400))
        req.num_computed = 399  # 399 tokens cached in the target, none in the draft
    ending.output_ids = [7] * 98  # 2 tokens left: the catch-up cannot pay for itself
    assert plan([fresh]) == [4]
    assert plan([lagging]) == [4]  # 100 tokens left share the catch-up
    assert plan([ending]) == [0]


def test_a_probe_never_catches_a_lagging_draft_cache_up():
    """A request the draft model does not pay for probes one draft every PROBE_INTERVAL passes,
    but only while the draft's cache is current: catching it up first costs an eager forward over
    every token since the draft last ran (100-140 ms on an H100, 20-30 decode steps)."""
    current, lagging = request(0.1), request(0.1)
    current.draft_computed = current.num_computed  # the draft has every token but the one to feed
    lagging.all_ids = list(range(60))
    lagging.num_computed = 59  # 59 tokens cached in the target, none in the draft
    for req in (current, lagging):
        req.stats.verify_steps = PROBE_INTERVAL - 1
    assert plan([current]) == [1] and plan([lagging]) == [0]
    # The same for a seeded sampled request, whose k comes from its own history alone.
    seeded_current, seeded_lagging = request(0.1, seed=7, temperature=0.8), request(0.1, seed=7, temperature=0.8)
    seeded_current.draft_computed = seeded_current.num_computed
    seeded_lagging.all_ids, seeded_lagging.num_computed = list(range(60)), 59
    for req in (seeded_current, seeded_lagging):
        req.stats.verify_steps = PROBE_INTERVAL - 1
    assert plan([seeded_current]) == [1] and plan([seeded_lagging]) == [0]


def test_the_draft_model_does_not_start_while_a_prompt_is_prefilled():
    """The first request of a burst is prefilled alone and decodes its first token beside the
    others' prompts. Starting the draft model on it there (one forward over its whole prompt)
    paid only for the lone stream it seemed to be, so the draft model starts on a request only in
    a step that prefills no prompt, when the batch is seen as it is. Lookups draft at once, and a
    request whose draft cache is current keeps drafting beside a prompt."""
    prefilling = request(0.9)
    prefilling.output_ids, prefilling.all_ids, prefilling.num_computed = [], prefilling.all_ids[:2], 0
    prompt = lambda: ScheduledRequest(prefilling, 2)  # noqa: E731 - a fresh item (the whole prompt) per plan
    assert prompt().completes and prefilling.in_prefill

    def drafted(method: str, items: list[ScheduledRequest], adaptive: bool = True, lookups=None):  # type: ignore[no-untyped-def]
        SpeculationPolicy(method, CPU_COSTS, adaptive=adaptive, max_model_len=4096, lookups=lookups or {}).plan(items)
        return [(it.num_drafts, it.source) for it in items]

    assert drafted("draft", [prompt()]) == [(0, None)]
    [(k, source)] = drafted("auto", [prompt()], lookups={"ngram": RepeatLookup(5)})
    assert k > 0 and source == "ngram"
    assert drafted("draft", [prompt()], adaptive=False) == [(4, "draft")]  # fixed depth: as configured
    # The first of a burst decodes beside the others' prompts: it waits for the next step.
    first, current = request(0.9), request(0.9)
    current.draft_computed = current.num_computed
    assert drafted("draft", [ScheduledRequest(first, 1), prompt()]) == [(0, None), (0, None)]
    assert drafted("draft", [ScheduledRequest(current, 1), prompt()])[0][1] == "draft"
    assert plan([first]) == [4]  # no prompt in the step: alone, the draft model pays
