"""A step looks each request up once, and the cost model learns once per real step.

The speculation policy asks the lookup proposers (n-gram, suffix) what they have for each request
at its cap, to price its drafts; the step then verifies the policy's lookup cut to the chosen k
(``ScheduledRequest.looked_up``), instead of asking the proposers again. Counted here in real
engine runs on the tiny pair, through every path a lookup could be made on: fixed and adaptive
k, chains and token trees, a grammar, a seeded request, logprobs (chains only), prompt chunks (no
drafts), and a batch that fails after planning and is bisected (its halves run again on the
same items: no lookup either). Greedy output stays the target's own.

A bisected batch's halves are not steps the scheduler planned: the cost model learns the whole
step only (``Engine._run``), so one failure does not teach it 2*log2(N) steps of odd shapes.
"""

from __future__ import annotations

from collections import Counter

import pytest

from specdec_core import Engine, EngineConfig, SamplingParams
from specdec_core.decoding.structured_output import StructuredOutput
from tests.helpers.fault_hooks import fail_planned_steps_holding
from tests.helpers.models import load

SCHEMA = {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]}, "ok": {"type": "boolean"}},
          "required": ["colour", "ok"], "additionalProperties": False}
PROMPTS = [
    "1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2,",
    "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a + b\n\ndef add(",
    " ".join(["the quick brown fox jumps over the lazy dog."] * 5),  # longer than a prefill chunk
]
GREEDY = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
OTHERS = [  # a grammar (chains cut by it), a seeded sampled request, logprobs (chains, not trees)
    ("Answer in JSON: {\"colour\": \"red\", \"ok\": true} again:",
     SamplingParams(max_tokens=20, temperature=0.0, structured=StructuredOutput(json_schema=SCHEMA))),
    (PROMPTS[0], SamplingParams(max_tokens=20, temperature=0.9, seed=7, ignore_eos=True)),
    (PROMPTS[1], SamplingParams(max_tokens=20, temperature=0.0, logprobs=2, ignore_eos=True)),
]


@pytest.fixture(scope="module")
def pair(tiny_target, tiny_draft):
    return load(tiny_target), load(tiny_draft, role="draft")


def engine(pair, method: str, adaptive: bool = False) -> Engine:
    cfg = EngineConfig(speculative_method=method, num_speculative_tokens=4, adaptive_speculation=adaptive, seed=0,
                       quantize="int8", max_num_seqs=8, prefill_chunk_size=16)
    return Engine.from_loaded(cfg, pair[0], pair[1] if method == "auto" else None)


@pytest.fixture(scope="module")
def reference(pair) -> dict[str, list[int]]:
    """Each greedy prompt's tokens from the target alone."""
    eng = engine(pair, "none")
    return {p: eng.generate([p], GREEDY)[0].token_ids for p in PROMPTS}


def count_lookups(eng: Engine) -> list[tuple[Counter, Counter]]:
    """Per planned step: the lookups made (by source and request id) and those expected, one per
    lookup source for every request the step speculates for (it completes its known tokens and
    has room for a draft). A lookup made outside the policy's plan fails at once. Each planned
    item's drafts are checked against a lookup at its k, as the step used to make (not counted)."""
    steps: list[tuple[Counter, Counter]] = []
    planning, checking = [False], [False]
    at_k = {source: proposer.lookup_tree for source, proposer in eng.policy.lookups.items()}
    for source, proposer in eng.policy.lookups.items():
        for name in ("propose", "lookup_tree", "lookup"):
            def counted(req, k, _real=getattr(proposer, name), _source=source):
                if not checking[0]:
                    assert planning[0], "a lookup outside the policy's plan"
                    steps[-1][0][_source, req.request_id] += 1
                return _real(req, k)
            setattr(proposer, name, counted)
    real_plan = eng.policy.plan

    def plan(items):
        expected = Counter({(source, it.request.request_id): 1 for it in items for source in eng.policy.lookups
                            if it.completes and min(it.request.max_spec_tokens,
                                                    it.request.params.max_tokens - len(it.request.output_ids),
                                                    eng.max_model_len - it.request.num_tokens) > 0})
        steps.append((Counter(), expected))
        planning[0] = True
        try:
            real_plan(items)
        finally:
            planning[0] = False
        checking[0] = True
        for it in items:
            assert (it.looked_up is not None) == (it.source in at_k and it.num_drafts > 0)
            if it.looked_up is not None:
                assert it.looked_up == at_k[it.source](it.request, it.num_drafts)
        checking[0] = False

    eng.policy.plan = plan  # type: ignore[method-assign]
    return steps


def run(eng: Engine, prompts: list[tuple[str, SamplingParams]]) -> list:
    reqs = [eng.make_request(p, params) for p, params in prompts]
    for r in reqs:
        eng.add_request(r)
    while eng.has_unfinished():
        eng.step()
    return reqs


@pytest.mark.parametrize("method, adaptive", [("ngram", False), ("suffix", False), ("auto", False), ("auto", True)])
def test_each_speculating_request_is_looked_up_once_a_step(pair, reference, method, adaptive):
    eng = engine(pair, method, adaptive)
    steps = count_lookups(eng)
    reqs = run(eng, [(p, GREEDY) for p in PROMPTS] + OTHERS)
    assert [r.output_ids for r in reqs[:len(PROMPTS)]] == [reference[p] for p in PROMPTS]
    for i, (made, expected) in enumerate(steps):
        assert made == expected, i
    assert sum(sum(expected.values()) for _, expected in steps) > 2 * len(steps)
    by_source = eng.metrics.draft_tokens_by_source
    if not adaptive:  # every speculating step drafts: the looked-up drafts were verified
        assert by_source.get("ngram", 0) + by_source.get("suffix", 0) > 0, by_source


@pytest.mark.parametrize("method", ["ngram", "suffix"])
def test_a_bisected_step_is_neither_looked_up_again_nor_learned(pair, reference, method, monkeypatch):
    """A neighbour's fault once every draft is planned: the batch is bisected and its healthy half
    runs again with the drafts the policy chose (the same request state: nothing moved), and
    keeps the target's greedy tokens. The cost model learns every whole step that ran and none
    of the halves."""
    fail_planned_steps_holding("BOOM", monkeypatch.setattr, after_tokens=4)
    eng = engine(pair, method)
    steps = count_lookups(eng)
    runs: list[tuple[int, bool, bool]] = []  # (items, whole, it ran) per ``_run``
    observed: list[int] = []
    real_run, real_observe = eng._run, eng.step_costs.observe

    def run_counted(plan, *, whole):
        try:
            out = real_run(plan, whole=whole)
        except Exception:
            runs.append((len(plan.items), whole, False))
            raise
        runs.append((len(plan.items), whole, True))
        return out

    def observe(items, *args):
        observed.append(len(items))
        return real_observe(items, *args)

    eng._run = run_counted  # type: ignore[method-assign]
    eng.step_costs.observe = observe  # type: ignore[method-assign]
    before = eng.step_costs.costs.observed_steps
    reqs = run(eng, [(p, GREEDY) for p in PROMPTS] + [("please BOOM now", GREEDY)])
    assert reqs[-1].finish_reason == "error"
    assert [r.output_ids for r in reqs[:len(PROMPTS)]] == [reference[p] for p in PROMPTS]
    assert all(made == expected for made, expected in steps)
    assert any(not whole and ran for _, whole, ran in runs), runs  # a half ran (and was committed)
    assert (len(PROMPTS) + 1, True, False) in runs  # after the whole batch failed
    assert observed == [n for n, whole, ran in runs if whole and ran]
    assert eng.step_costs.costs.observed_steps - before <= len(observed)
