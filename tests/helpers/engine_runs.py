"""Running an ``Engine`` to the end in tests: prompts submitted at once or one every few steps,
and what the deltas carried."""

from __future__ import annotations

from specdec_core import Engine, SamplingParams


def run_to_end(eng: Engine, prompts: list, params: SamplingParams) -> list:
    """Submit ``prompts`` to an ``Engine`` at once and step it until they finish: each request
    with every delta it emitted, in the prompts' order."""
    reqs = [eng.make_request(p, params) for p in prompts]
    for r in reqs:
        eng.add_request(r)
    deltas: dict[str, list] = {r.request_id: [] for r in reqs}
    while eng.has_unfinished():
        for out in eng.step():
            deltas[out.request_id].append(out)
    return [(r, deltas[r.request_id]) for r in reqs]


def logprob_values(deltas: list) -> list[float]:
    """The emitted tokens' log-probabilities over a request's deltas."""
    return [lp.logprob for out in deltas for lp in out.logprobs or []]


def run_staggered(eng: Engine, prompts: list[str], params: SamplingParams, every: int = 2) -> list[list[int]]:
    """Submit one prompt every ``every`` steps, so requests join a batch already in flight."""
    reqs = []
    pending = list(prompts)
    step = 0
    while pending or eng.has_unfinished():
        if pending and step % every == 0:
            req = eng.make_request(pending.pop(0), params)
            eng.add_request(req)
            reqs.append(req)
        eng.step()
        step += 1
    return [r.output_ids for r in reqs]
