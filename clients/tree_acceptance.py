#!/usr/bin/env python3
"""How many tokens per target step would token *trees* from the suffix tries accept, against the
linear proposals specdec verifies today? An offline replay, to decide whether tree verification
(issue 23 part 2) is worth its cost before building it.

1. Generate every request's greedy output with the target alone (the engine, speculation off):
   the agentic sessions (each turn re-sends the history with the real earlier answers), the chat
   prompts and the code-editing prompts of ``clients/prompts.json``.
2. Replay each output as a greedy speculative run would see it: at every step the proposer looks
   at the request's text so far, in its own suffix trie and in the global trie of the requests
   finished before it (exactly ``SuffixProposer``'s tries and scoring); the step accepts the
   proposal's longest prefix that equals the real output, plus the target's own token.
   - linear k: today's proposal (the most frequent continuation, at most k tokens);
   - tree N: the N nodes of highest path probability below the best match (count ratios,
     at least ``MIN_TOKEN_PROB`` each, depth <= k), which a tree verification would score in one
     forward of N + 1 rows; a step accepts the deepest node on the real path.
   Greedy acceptance does not depend on how the rows are computed, so this is what verification
   would accept; what it would cost per step is the step-cost table's (N + 1 rows).

    python clients/tree_acceptance.py --model SmolLM2-135M-Instruct.Q4_1.gguf --max-tokens 96
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))

from specdec_core.speculation.suffix import MIN_TOKEN_PROB, SPEC_FACTOR  # noqa: E402
from specdec_core.speculation.suffix_trie import SuffixCache, SuffixIndex, SuffixTrie  # noqa: E402


def tree(trie: SuffixTrie, context: list[int], nodes: int, depth: int, max_match: int) -> tuple[set[tuple[int, ...]], float]:
    """The ``nodes`` paths of highest probability below the longest match (and their expected
    accepted length, the sum of path probabilities)."""
    m, node = trie.longest_match(context, max_match)
    if node is None:
        return set(), 0.0
    limit = min(depth, math.ceil(SPEC_FACTOR * m))
    heap: list = [(-1.0, (), node)]
    chosen: set[tuple[int, ...]] = set()
    score = 0.0
    while heap and len(chosen) < nodes + 1:
        neg, path, at = heapq.heappop(heap)
        if path:
            chosen.add(path)
            score -= neg
        kids = trie.children(at)
        if len(path) >= limit or not kids:
            continue
        for token, child in kids.items():
            p = trie.count(child) / trie.count(at)
            if p >= MIN_TOKEN_PROB:
                heapq.heappush(heap, (neg * p, path + (token,), child))
    return chosen, score


def accepted(paths: set[tuple[int, ...]], truth: list[int]) -> int:
    n = 0
    while n < len(truth) and tuple(truth[:n + 1]) in paths:
        n += 1
    return n


def replay(requests: list[tuple[list[int], list[int]]], nodes: int, depth: int, linear: bool, trie_depth: int = 24,
           cache_tokens: int = 16384) -> tuple[int, int]:
    """(tokens, steps) over all requests in order; ``linear``: a path of at most ``depth`` tokens."""
    cache = SuffixCache(trie_depth, cache_tokens)
    max_match = trie_depth // 2
    tokens = steps = 0
    for prompt, out in requests:
        own = SuffixIndex(trie_depth)
        t = 0
        while t < len(out):
            text = prompt + out[:t]
            own.catch_up(text)
            ctx = text[-max_match:]
            best: set[tuple[int, ...]] = set()
            best_score = -1.0
            for trie in (own.trie, cache.trie):
                if linear:
                    prop = trie.propose(ctx, depth, max_match, MIN_TOKEN_PROB, SPEC_FACTOR)
                    paths, score = {tuple(prop.tokens[:i + 1]) for i in range(len(prop.tokens))}, prop.score
                else:
                    paths, score = tree(trie, ctx, nodes, depth, max_match)
                if score > best_score:
                    best, best_score = paths, score
            t += accepted(best, out[t:]) + 1
            steps += 1
        tokens += len(out)
        cache.add(out)
    return tokens, steps


def generate(model: str | None, max_tokens: int, kinds: list[str], agentic_max_tokens: int | None = None,
             quantize: str = "auto") -> dict[str, list[tuple[list[int], list[int]]]]:
    """Greedy outputs of the target alone (``model`` None: the embedded pair's), per kind; the
    agentic turns with ``agentic_max_tokens`` (default ``max_tokens``)."""
    from specdec_core import Engine, EngineConfig, SamplingParams

    sys.path.insert(0, str(ROOT))
    from benchmark.agentic import load_sessions

    engine = Engine(EngineConfig(model=model, quantize=quantize, speculative_method="none",  # type: ignore[arg-type]
                                 max_model_len=8192), progress=False)
    tok = engine.tokenizer
    prompts = json.loads((ROOT / "prompts.json").read_text())
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
    p.add_argument("--model", required=True)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--kinds", default="agentic,chat,code_edit")
    p.add_argument("--save", type=Path, default=None, help="keep the generated outputs here (JSON)")
    p.add_argument("--load", type=Path, default=None, help="replay outputs saved by --save")
    args = p.parse_args(argv)
    data = json.loads(args.load.read_text()) if args.load else generate(args.model, args.max_tokens, args.kinds.split(","))
    if args.save:
        args.save.write_text(json.dumps(data))
    print("| kind | proposal | rows verified | tokens per step |")
    print("|---|---|---|---|")
    for kind, requests in data.items():
        for label, nodes, depth, linear in (("linear k=4", 4, 4, True), ("linear k=8", 8, 8, True),
                                            ("tree 4 nodes", 4, 4, False), ("tree 8 nodes", 8, 8, False),
                                            ("tree 16 nodes", 16, 8, False)):
            tokens, steps = replay(requests, nodes, depth, linear)
            print(f"| {kind} | {label} | {nodes + 1} | {tokens / steps:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
