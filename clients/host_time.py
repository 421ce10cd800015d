#!/usr/bin/env python3
"""Where a step's host time goes, speculation on against off, in one process.

The paired bench (``bench.py --pairing same``) says how much slower 'on' is where `auto` hardly
drafts (4 and 16 streams on the CPU); this says where that time goes. It runs the engine in
process on the default pair (or ``--model``), batches of ``--concurrency`` prompts of one kind,
each batch once with speculation on (the engine's method) and once off (``num_speculative_tokens``
0), in alternating order over ``--rounds``, and reports per engine step the milliseconds of each
phase the host runs: the scheduler, the policy (and inside it the lookups), the step's own plan,
the commit, the target and draft forwards, and the cyclic garbage collector by generation (a
``gc.callbacks`` hook), next to the step's wall time.

    python clients/host_time.py --kind chat --concurrency 4 --rounds 4
    python clients/host_time.py --kind code_edit --concurrency 16 --rounds 2 --json out.json

Found with it (2026-11-27): the suffix tries' node objects made an 'on' request trigger the
collector every other step, and a full collection (~315 ms beside the default pair's startup
objects) inside a lookup; 'off' never paid it (docs/speculation-measurements.md).
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

PROMPTS = Path(__file__).with_name("prompts.json")


class PhaseClock:
    """Seconds spent in wrapped methods and in garbage collections, by name, since ``reset``."""

    def __init__(self) -> None:
        self.seconds: defaultdict[str, float] = defaultdict(float)
        self._gc_start = 0.0
        gc.callbacks.append(self._on_gc)

    def reset(self) -> None:
        self.seconds.clear()

    def wrap(self, owner: Any, name: str, phase: str) -> None:
        method: Callable[..., Any] = getattr(owner, name)

        @functools.wraps(method)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self.seconds[phase] += time.perf_counter() - start

        setattr(owner, name, timed)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
        else:
            self.seconds[f"gc{info['generation']}"] += time.perf_counter() - self._gc_start


def render(tokenizer: Any, prompt: str | list[dict[str, str]]) -> str:
    messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="target (default: the embedded pair)")
    ap.add_argument("--draft-model", default=None)
    ap.add_argument("--quantize", default="gguf")
    ap.add_argument("--kind", default="chat", choices=["chat", "code_edit", "open"])
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    from specdec_core import Engine, EngineConfig, SamplingParams

    engine = Engine(EngineConfig(model=args.model, draft_model=args.draft_model, quantize=args.quantize,
                                 max_num_seqs=max(args.concurrency, 1)))
    clock = PhaseClock()
    clock.wrap(engine, "step", "step")
    clock.wrap(engine.scheduler, "schedule", "schedule")
    clock.wrap(engine.policy, "plan", "policy")
    clock.wrap(engine.speculative_step, "_plan", "step_plan")
    clock.wrap(engine, "_commit_step", "commit")
    for source, proposer in engine.speculative_step.lookups.items():
        clock.wrap(proposer, "lookup_tree", f"lookup_{source}")  # the policy's and the step's: one object
    prompts = json.loads(PROMPTS.read_text())[args.kind]
    rows: list[dict[str, Any]] = []
    print(f"method {engine.policy.method}, lookups {sorted(engine.speculative_step.lookups)}, "
          f"{len(gc.get_objects())} objects the collector tracks", flush=True)
    for r in range(args.rounds):
        batch = [render(engine.tokenizer, p) for p in prompts[r * args.concurrency:(r + 1) * args.concurrency]]
        for arm in ("on", "off") if r % 2 == 0 else ("off", "on"):
            params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0,
                                    num_speculative_tokens=None if arm == "on" else 0)
            m = engine.metrics
            steps0, target0, draft0 = m.total_steps, m.total_target_seconds, m.total_draft_seconds
            clock.reset()
            engine.generate(batch, params)  # type: ignore[arg-type]
            steps = m.total_steps - steps0
            clock.seconds["target"] = m.total_target_seconds - target0
            clock.seconds["draft"] = m.total_draft_seconds - draft0
            row = {"round": r, "arm": arm, "steps": steps,
                   **{k: round(v / steps * 1e3, 3) for k, v in sorted(clock.seconds.items())}}
            rows.append(row)
            print(row, flush=True)
    print("\nmean ms per step, on - off:")
    phases = sorted({k for row in rows for k in row} - {"round", "arm", "steps"})
    for phase in phases:
        mean = {arm: sum(row.get(phase, 0.0) for row in rows if row["arm"] == arm) / max(args.rounds, 1)
                for arm in ("on", "off")}
        print(f"  {phase:14s} on {mean['on']:9.3f}  off {mean['off']:9.3f}  diff {mean['on'] - mean['off']:+8.3f}")
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
