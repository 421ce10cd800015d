#!/usr/bin/env python3
"""Time to first token of a prompt whose first chunks are in the prefix cache, against the same
prompt recomputed: the case of a chat app resending its history, or an agent resending a file.

One engine (the embedded default pair unless ``--model``) answers a long prompt (a source file of
this repository, ``--prefix-tokens`` tokens of it, plus a question), then a second prompt with the
same prefix and another question, once with the cache and once with it switched off, then with it
again. Then a conversation: a shorter prompt answered in ``--answer-tokens`` tokens, and the next
turn, which re-sends that answer, with the answer's blocks shared and not (``share_outputs``;
each in a cache of its own, ``cache_salt``). Prints each time to first token and how many prompt
tokens the cache served.

    python clients/tools/prefix_cache_ttft.py
    python clients/tools/prefix_cache_ttft.py --model SmolLM2-135M-Instruct.Q4_1.gguf --prefix-tokens 1100
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # run as `python clients/tools/prefix_cache_ttft.py`: the checkout's packages import
    sys.path.insert(0, str(REPO))
SOURCE = REPO / "specdec_core" / "engine" / "engine.py"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="target (default: the embedded pair)")
    p.add_argument("--draft-model", default=None)
    p.add_argument("--prefix-tokens", type=int, default=1100, help="shared prompt tokens (cut from SOURCE)")
    p.add_argument("--prefill-chunk-size", type=int, default=512)
    p.add_argument("--answer-tokens", type=int, default=128, help="the conversation's first answer")
    args = p.parse_args(argv)
    from specdec_core import Engine, EngineConfig, SamplingParams

    eng = Engine(EngineConfig(model=args.model, draft_model=args.draft_model, max_num_seqs=4, seed=0,
                              prefill_chunk_size=args.prefill_chunk_size), progress=False)
    shared = eng.tokenizer.encode(SOURCE.read_text())[: args.prefix_tokens]
    questions = [eng.tokenizer.encode(f"\n# Question: {q}\n") for q in ("what does step() do?", "where are requests retired?")]
    params = SamplingParams(max_tokens=8, temperature=0.0)

    def ttft(prompt: list[int], params: SamplingParams = params) -> tuple[float, int]:
        req = eng.make_request(prompt, params)
        eng.add_request(req)
        t0, first = time.perf_counter(), None
        while eng.has_unfinished():
            outs = eng.step()
            if first is None and any(o.token_ids for o in outs if o.request_id == req.request_id):
                first = time.perf_counter() - t0
        return first or 0.0, req.stats.cached_tokens

    rows = [("first prompt, cold", shared + questions[0]), ("second prompt, cached prefix", shared + questions[1])]
    for name, prompt in rows:
        print("%-32s TTFT %6.2f s, %5d prompt tokens from the cache" % ((name,) + ttft(prompt)))
    cache, eng.scheduler.prefix = eng.scheduler.prefix, None
    print("%-32s TTFT %6.2f s, %5d prompt tokens from the cache" % (("second prompt, cache off",) + ttft(shared + questions[1])))
    eng.scheduler.prefix = cache
    print("%-32s TTFT %6.2f s, %5d prompt tokens from the cache" % (("second prompt, cache on again",) + ttft(shared + questions[1])))
    sharing = eng.scheduler.share_outputs  # False where rows share attention calls (nothing to compare)
    for share in sorted({False, sharing}):
        eng.scheduler.share_outputs = share
        salt = f"answers-shared-{share}"
        first = shared[:256] + questions[0]
        answer = eng.generate([first], SamplingParams(max_tokens=args.answer_tokens, temperature=0.0, ignore_eos=True,
                                                      cache_salt=salt))[0].token_ids
        name = f"next turn, answer {'shared' if share else 'not shared'}"
        print("%-32s TTFT %6.2f s, %5d prompt tokens from the cache (%d answered)" % (
            (name,) + ttft(first + answer + questions[1], SamplingParams(max_tokens=8, temperature=0.0, cache_salt=salt))
            + (len(answer),)))
    eng.scheduler.share_outputs = sharing
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
