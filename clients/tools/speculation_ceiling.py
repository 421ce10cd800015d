#!/usr/bin/env python3
"""How fast can lookup speculation make a workload on this machine, at most? The engine's own
policy and proposers replayed over real greedy outputs, against an oracle that knows how many
drafts the target will accept, both priced by a measured step-cost table.

A served benchmark (``bench.py``) says what speculation gives; it cannot say what it *could*
give: whether a goal is out of reach for the policy (it guesses acceptance) or for any policy
(the proposals and the price of a verified row decide). This replay separates the two:

1. Every request's greedy output is generated with the target alone (``generate``:
   the agentic sessions re-send their real earlier answers; the chat and code_edit prompts of
   ``prompts.json``), or loaded from an earlier ``--save``.
2. Each output is replayed as a greedy speculative run would see it, one verify pass at a time:
   - ``policy``: the engine's ``SpeculationPolicy`` chooses the source and k from the lookups'
     evidence and the cost table, the real ``NgramProposer``/``SuffixProposer`` propose
     (the global suffix trie fed by the requests finished before; suffix token trees as the
     server's default, ``--no-trees`` for chains), the pass keeps the drafts' longest path
     that equals the real output plus the target's own token, and the request and the
     policy's calibration learn from it as the engine's commit makes them (``Request.learn``,
     ``SpeculationPolicy.learn``: every lookup scored);
     ``--concurrency N`` replays N requests in one step each pass, as the server batches them;
   - ``oracle``: for each lookup's proposal the number the target would accept is known, and the
     pass takes the source and k that commit the most tokens per second of the pass.
   Greedy acceptance does not depend on how the rows are computed, so this is what a served run
   accepts (the same tokens in the same order).
3. Seconds come from the table: a pass of 1 + k rows costs ``target(1 + k)`` with the request's
   cached tokens (a step of several requests: their rows together), speculation off the same
   replay without drafts. Decode only: prefill, the host's
   work and the HTTP layer are the same with and without speculation and are left out, so a
   served ratio is lower than this one by their share.

The draft model is not replayed (its proposals need its own forwards): ``auto`` here is the
per-pass choice between the two lookups, what ``--speculative-method auto`` does without a draft
model. Served with the default pair, ``auto`` chose no draft-model tokens on these workloads.

    python clients/tools/speculation_ceiling.py --save /tmp/outputs.json       # generate, then replay
    python clients/tools/speculation_ceiling.py --load /tmp/outputs.json --costs ~/.cache/specdec/step-costs/X.json
    python clients/tools/speculation_ceiling.py --load /tmp/outputs.json --row-cost 0.25   # rows at a quarter of the price
    python clients/tools/speculation_ceiling.py --load /tmp/outputs.json --concurrency 4 --methods auto --caps 8
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # run as `python clients/tools/speculation_ceiling.py`: the checkout's packages import
    sys.path.insert(0, str(REPO))

from specdec_core import SamplingParams  # noqa: E402
from specdec_core.engine.request import Request  # noqa: E402
from specdec_core.speculation import acceptance  # noqa: E402
from specdec_core.speculation.acceptance import Source, kept_prefix  # noqa: E402
from specdec_core.speculation.cost_table import CostTable  # noqa: E402
from specdec_core.speculation.draft_tree import DraftTree  # noqa: E402
from specdec_core.speculation.ngram import NgramProposer  # noqa: E402
from specdec_core.speculation.policy import LookupProposer, SpeculationPolicy  # noqa: E402
from specdec_core.speculation.scheduled_request import ScheduledRequest  # noqa: E402
from specdec_core.speculation.step_costs import StepCostModel  # noqa: E402
from specdec_core.speculation.suffix import SuffixProposer  # noqa: E402

# One request's verify pass by rows, 256 cached tokens a row, the default pair's target (`gguf`):
# `python clients/tools/step_costs.py --modes gguf --stat min --repeats 5`, 2-core EPYC, ms
# (docs/speculation-measurements.md, "A verified row's cost, re-measured").
MEASURED_ROWS = ([1, 2, 3, 5, 9], [57.1, 61.6, 71.2, 92.2, 159.5])
MEASURED_PER_CONTEXT = 3.07e-6  # seconds per row and cached token past 256 (the calibration's term)
MEASURED_CONTEXT = 256
NGRAM_N = (1, 4)  # EngineConfig's ngram_min, ngram_max
SUFFIX_DEPTH, SUFFIX_CACHE_TOKENS = 24, 16384  # EngineConfig's suffix_depth, suffix_cache_tokens
MAX_MODEL_LEN = 32768


@dataclass
class Replay:
    """One workload under one chooser: decode seconds with and without speculation."""

    tokens: int = 0
    passes: int = 0
    drafted: int = 0
    accepted: int = 0
    seconds: float = 0.0
    off_seconds: float = 0.0

    @property
    def speedup(self) -> float:
        return self.off_seconds / self.seconds if self.seconds else 0.0


def cost_table(path: Path | None, row_cost: float) -> StepCostModel:
    """The target's table from a step-cost cache file (``SPECDEC_CACHE_DIR/step-costs/*.json``,
    as the server saved it) or the measured rows above; ``row_cost`` scales what each row past the
    first adds (0.25: rows at a quarter of their price, about an H100's)."""
    if path is not None:
        t = json.loads(path.read_text())["target"]
        sizes, seconds, per_context, context = t["sizes"], t["seconds"], t["per_context"], t["context"]
        per_request, grid_requests = t.get("per_request_context", 0.0), t.get("grid_requests", 0)
    else:
        sizes, ms = MEASURED_ROWS
        seconds, per_context, context = [s / 1000 for s in ms], MEASURED_PER_CONTEXT, MEASURED_CONTEXT
        per_request, grid_requests = 0.0, 0
    seconds = [seconds[0] + row_cost * (s - seconds[0]) for s in seconds]
    return StepCostModel(CostTable(list(sizes), seconds, per_context, context, per_request_context=per_request,
                                   grid_requests=grid_requests), None)


class Chooser:
    """The policy's choice for the passes of one step: each request's source and drafts."""

    def __init__(self, method: str, costs: StepCostModel, lookups: dict[Source, LookupProposer], cap: int) -> None:
        self.costs, self.lookups, self.cap = costs, lookups, cap
        self.policy = SpeculationPolicy(method, costs, adaptive=True, max_model_len=MAX_MODEL_LEN, lookups=lookups,
                                        has_draft=False)

    def choose(self, running: list[tuple[Request, list[int]]]) -> list[tuple[ScheduledRequest, DraftTree]]:
        """``running``: each request with the rest of its real output. The items carry what the
        policy looked up (``lookups``), which the request learns from as in the engine, and the
        drafts it chose (``looked_up``), which the engine's step verifies."""
        items = [ScheduledRequest(req, 1) for req, _ in running]
        self.policy.plan(items)
        return [(it, it.looked_up if it.looked_up is not None else DraftTree([])) for it in items]


class Oracle(Chooser):
    """Knows how many of each lookup's drafts the target keeps; verifies exactly the prefix that
    pays most per second (fewer where a row costs more than its token saves). One stream only:
    with several, the best k of one request depends on everyone else's."""

    def choose(self, running: list[tuple[Request, list[int]]]) -> list[tuple[ScheduledRequest, DraftTree]]:
        if len(running) != 1:
            raise ValueError("the oracle replays one stream at a time")
        req, truth = running[0]
        context = req.num_computed
        best: tuple[float, Source | None, list[int]] = (1 / self._cost(1, context), None, [])
        for source, proposer in self.lookups.items():
            drafts = proposer.propose(req, min(self.cap, len(truth) - 1)).tree.tokens
            for k in range(1, kept_prefix(drafts, truth) + 1):
                rate = (k + 1) / self._cost(k + 1, context)
                if rate > best[0]:
                    best = (rate, source, drafts[:k])
        return [(ScheduledRequest(req, 1, len(best[2]), best[1]), DraftTree.chain(best[2]))]

    def _cost(self, rows: int, context: int) -> float:
        return self.costs.target(rows, frozen=True, context_tokens=rows * context, request_context=context)


def replay(requests: list[tuple[list[int], list[int]]], method: str, costs: StepCostModel, cap: int,
           oracle: bool, concurrency: int = 1, trees: bool = False) -> Replay:
    """The requests in order, ``concurrency`` at a time (a new one starts as one finishes), one
    verify pass each per step as the engine commits them. Speculation off's seconds are the same
    replay with method ``none``. ``trees``: the policy's suffix lookups propose token trees, as
    the server's do by default (``--suffix-trees``); the oracle's are chains."""
    result = _run(requests, method, costs, cap, oracle, concurrency, trees and not oracle)
    result.off_seconds = _run(requests, "none", costs, cap, False, concurrency, False).seconds
    return result


def kept_path(tree: DraftTree, truth: list[int]) -> int:
    """How many drafts a greedy verification of ``tree`` against ``truth`` keeps: the depth of
    its deepest node whose path is truth's first tokens (a chain: ``kept_prefix``)."""
    return max((d for d, kept in zip(tree.depths, tree.follows(truth)) if kept), default=0)


def _run(requests: list[tuple[list[int], list[int]]], method: str, costs: StepCostModel, cap: int,
         oracle: bool, concurrency: int, trees: bool) -> Replay:
    ngram, suffix = NgramProposer(*NGRAM_N), SuffixProposer(SUFFIX_DEPTH, SUFFIX_CACHE_TOKENS, trees)
    lookups: dict[Source, LookupProposer] = {s: p for s, p in (("ngram", ngram), ("suffix", suffix))
                                             if method in (s, "auto")}
    chooser = (Oracle if oracle else Chooser)(method, costs, lookups, cap)
    result = Replay()
    waiting = list(enumerate(requests))
    running: list[tuple[Request, list[int]]] = []
    while waiting or running:
        while waiting and len(running) < concurrency:
            i, (prompt, out) = waiting.pop(0)
            req = Request(f"r{i}", list(prompt), SamplingParams(max_tokens=len(out), temperature=0.0),
                          random.Random(0), None, cap, ngram=ngram.new_index(),  # type: ignore[arg-type]
                          suffix=suffix.new_index())
            req.num_computed = len(prompt) - 1  # prefilled: the last prompt token is the next step's
            running.append((req, out))
        passes = chooser.choose([(req, out[len(req.output_ids):]) for req, out in running])
        rows = sum(1 + len(drafts) for _, drafts in passes)
        result.seconds += costs.target(rows, frozen=True, context_tokens=sum(
            (1 + len(drafts)) * it.request.num_computed for it, drafts in passes),
            request_context=sum(it.request.num_computed for it, _ in passes))
        for (req, out), (it, drafts) in zip(running, passes):
            truth = out[len(req.output_ids):]
            kept = kept_path(drafts, truth)
            new = truth[:kept + 1]
            req.learn(it.source, kept, len(drafts), it.lookups, new)
            chooser.policy.learn(it, new)
            req.num_computed += len(new)
            req.all_ids += new
            req.output_ids += new
            req.stats.record_verify(len(new), len(drafts), kept)
            result.passes += 1
            result.drafted += len(drafts)
            result.accepted += kept
        for req, out in [r for r in running if len(r[0].output_ids) >= len(r[1])]:
            result.tokens += len(out)
            suffix.retire(req)
        running = [r for r in running if len(r[0].output_ids) < len(r[1])]
    return result


def generate(model: str | None, max_tokens: int, kinds: list[str], agentic_max_tokens: int | None = None,
             quantize: str = "auto") -> dict[str, list[tuple[list[int], list[int]]]]:
    """Greedy outputs of the target alone (``model`` None: the embedded pair's), per kind; the
    agentic turns with ``agentic_max_tokens`` (default ``max_tokens``)."""
    from clients.benchmark.agentic import load_sessions
    from specdec_core import Engine, EngineConfig

    engine = Engine(EngineConfig(model=model, quantize=quantize, speculative_method="none",  # type: ignore[arg-type]
                                 max_model_len=8192), progress=False)
    tok = engine.tokenizer
    prompts = json.loads((REPO / "clients" / "prompts.json").read_text())
    out: dict[str, list[tuple[list[int], list[int]]]] = {}

    def run(ids: list[int], max_new: int = max_tokens) -> list[int]:
        return engine.generate([ids], SamplingParams(max_tokens=max_new, temperature=0.0))[0].token_ids

    def chat(messages: list[dict[str, str]]) -> list[int]:
        return list(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))

    if "agentic" in kinds:
        out["agentic"] = []
        for session in load_sessions():
            messages = [{"role": "system", "content": session["system"]}]
            for turn in session["turns"]:
                messages.append({"role": "user", "content": turn})
                ids = chat(messages)
                answer = run(ids, agentic_max_tokens or max_tokens)
                out["agentic"].append((ids, answer))
                messages.append({"role": "assistant", "content": tok.decode(answer, skip_special_tokens=True)})

    def run_all(prompt_ids: list[list[int]]) -> list[tuple[list[int], list[int]]]:
        """Independent prompts in one batch: the CPU forward is batch-invariant, so each output is
        the one it would be alone, at a few times the throughput."""
        done = engine.generate(list(prompt_ids), SamplingParams(max_tokens=max_tokens, temperature=0.0))
        return [(ids, c.token_ids) for ids, c in zip(prompt_ids, done)]

    if "chat" in kinds:
        out["chat"] = run_all([chat(m) for m in prompts["chat"]])
    if "code_edit" in kinds:
        out["code_edit"] = run_all([tok.encode(p) for p in prompts["code_edit"]])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="target (default: the embedded pair's 1.5B)")
    p.add_argument("--quantize", default="gguf")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--agentic-max-tokens", type=int, default=256, help="as bench.py's agentic turns")
    p.add_argument("--kinds", default="agentic,code_edit")
    p.add_argument("--save", type=Path, default=None, help="keep the generated outputs here (JSON)")
    p.add_argument("--load", type=Path, default=None, help="replay outputs saved by --save")
    p.add_argument("--costs", type=Path, default=None, help="a step-cost cache file (default: the rows measured above)")
    p.add_argument("--row-cost", type=float, default=1.0, help="scale what a row past the first costs")
    p.add_argument("--caps", default="4,8,12", help="most drafts a pass verifies (the server's k)")
    p.add_argument("--methods", default="ngram,suffix,auto")
    p.add_argument("--concurrency", type=int, default=1, help="requests replayed together (the oracle: 1 only)")
    p.add_argument("--trees", action=argparse.BooleanOptionalAction, default=True,
                   help="the policy's suffix lookups propose token trees, as the server's do by default")
    p.add_argument("--confidence-z", type=float, default=acceptance.CONFIDENCE_Z,
                   help="the policy's lower bound on lookup acceptance, in standard errors (0: the mean)")
    args = p.parse_args(argv)
    if args.load:
        data = json.loads(args.load.read_text())
    else:
        data = generate(args.model, args.max_tokens, args.kinds.split(","), args.agentic_max_tokens, args.quantize)
    if args.save:
        args.save.write_text(json.dumps(data))
    acceptance.CONFIDENCE_Z = args.confidence_z
    costs = cost_table(args.costs, args.row_cost)
    print(f"target rows 1, 5, 9: {', '.join(f'{costs.target(n, frozen=True) * 1000:.1f}' for n in (1, 5, 9))} ms")
    print("| kind | k | method | policy | oracle | policy tokens/pass | oracle tokens/pass | policy acceptance |")
    print("|---|---|---|---|---|---|---|---|")
    for kind, requests in data.items():
        for cap in (int(c) for c in args.caps.split(",")):
            for method in args.methods.split(","):
                pol = replay(requests, method, costs, cap, False, args.concurrency, args.trees)
                orc = replay(requests, method, costs, cap, True) if args.concurrency == 1 else None
                o_speedup, o_tokens = (f"{orc.speedup:.2f}x", f"{orc.tokens / orc.passes:.2f}") if orc else ("-", "-")
                print(f"| {kind} | {cap} | {method} | {pol.speedup:.2f}x | {o_speedup} | {pol.tokens / pol.passes:.2f} | "
                      f"{o_tokens} | {pol.accepted / max(pol.drafted, 1):.2f} ({pol.drafted} drafted) |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
