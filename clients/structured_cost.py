#!/usr/bin/env python3
"""What structured output costs: grammar-mask time per step, and acceptance and tokens per second
with and without a JSON-schema constraint, on the same prompts, in one process.

Chat prompts that ask for JSON run four ways on one engine (models and kernels prepared once):
speculation off (``num_speculative_tokens=0``) or on (the engine's method, ``auto`` by default),
each unconstrained and constrained by the prompt's schema. Greedy. Grammar time is measured by
timing every ``GrammarState`` call (mask computation, draft pushes, commits, lookup checks).

    python clients/structured_cost.py --concurrency 1,4 --max-tokens 96
"""

from __future__ import annotations

import argparse
import time
from contextlib import contextmanager
from typing import Any, Iterator

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
          "city": {"type": "string"}, "languages": {"type": "array", "items": {"type": "string"}}},
          "required": ["name", "age", "city", "languages"], "additionalProperties": False}
FUNCS = {"type": "object", "properties": {"functions": {"type": "array", "items": {
    "type": "object", "properties": {"name": {"type": "string"}, "purpose": {"type": "string"}},
    "required": ["name", "purpose"], "additionalProperties": False}}}, "required": ["functions"],
    "additionalProperties": False}
BUG = {"type": "object", "properties": {"line": {"type": "integer"}, "problem": {"type": "string"},
       "fix": {"type": "string"}}, "required": ["line", "problem", "fix"], "additionalProperties": False}
TASKS = [
    ("Extract the person as JSON with name, age, city and languages: 'Maria Silva is 34, lives in Lisbon "
     "and speaks Portuguese, English and French.'", PERSON),
    ("List three Python built-in functions as JSON: {\"functions\": [{\"name\": ..., \"purpose\": ...}]}.", FUNCS),
    ("Find the bug and answer as JSON with line, problem and fix:\n\n1 def mean(xs):\n2     total = 0\n"
     "3     for x in xs:\n4         total += x\n5     return total / len(x)\n", BUG),
    ("Describe Alan Turing as JSON with name, age at death, city of birth and languages he spoke.", PERSON),
]


@contextmanager
def timed_grammar() -> Iterator[list[float]]:
    """Accumulate the seconds spent in every GrammarState method while the block runs."""
    import specdec_core.decoding.grammar as grammar

    spent = [0.0]
    originals = {name: getattr(grammar.GrammarState, name) for name in ("mask", "commit", "valid_prefix")}

    def wrap(fn: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[0] += time.perf_counter() - t0
        return timed

    for name, fn in originals.items():
        setattr(grammar.GrammarState, name, wrap(fn))
    try:
        yield spent
    finally:
        for name, fn in originals.items():
            setattr(grammar.GrammarState, name, fn)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="target (default: the embedded pair)")
    p.add_argument("--draft-model", default=None)
    p.add_argument("--concurrency", default="1,4")
    p.add_argument("--max-tokens", type=int, default=96)
    args = p.parse_args()

    from specdec_core import Engine, EngineConfig, SamplingParams
    from specdec_core.decoding.structured_output import StructuredOutput

    eng = Engine(EngineConfig(model=args.model, draft_model=args.draft_model, max_num_seqs=4, seed=0), progress=False)
    tok = eng.tokenizer
    prompts = [tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
               for text, _ in TASKS]
    eng.generate(prompts[:1], SamplingParams(max_tokens=4, temperature=0.0))  # warm-up
    print(f"method {eng.method}; {len(TASKS)} prompts, greedy, max_tokens {args.max_tokens}")
    print(f"{'c':>2} {'spec':>4} {'schema':>6} {'tok/s':>6} {'accept':>6} {'tok/step':>8} {'step ms':>7} "
          f"{'grammar ms/step':>15} {'valid JSON':>10}")
    for c in [int(x) for x in args.concurrency.split(",")]:
        for spec in (False, True):
            for constrained in (False, True):
                params = [SamplingParams(max_tokens=args.max_tokens, temperature=0.0,
                                         num_speculative_tokens=None if spec else 0,
                                         structured=StructuredOutput(json_schema=schema) if constrained else None)
                          for _, schema in TASKS]
                m = eng.metrics
                before = (m.total_steps, m.total_step_seconds, m.total_draft_tokens, m.total_accepted_tokens,
                          m.total_generation_tokens)
                with timed_grammar() as spent:
                    t0 = time.perf_counter()
                    out = []
                    for i in range(0, len(prompts), c):
                        out += eng.generate(prompts[i:i + c], params[i:i + c])
                    wall = time.perf_counter() - t0
                steps = m.total_steps - before[0]
                drafted, accepted = m.total_draft_tokens - before[2], m.total_accepted_tokens - before[3]
                made = m.total_generation_tokens - before[4]
                valid = sum(_parses(o.text) for o in out)
                print(f"{c:>2} {'on' if spec else 'off':>4} {'yes' if constrained else 'no':>6} {made / wall:6.1f} "
                      f"{accepted / max(drafted, 1):6.2f} {made / steps:8.2f} "
                      f"{(m.total_step_seconds - before[1]) / steps * 1e3:7.1f} {spent[0] / steps * 1e3:15.2f} "
                      f"{valid:>6}/{len(out)}", flush=True)


def _parses(text: str) -> bool:
    import json

    try:
        json.loads(text)
    except ValueError:
        return False
    return True


if __name__ == "__main__":
    main()
