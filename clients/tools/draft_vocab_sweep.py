#!/usr/bin/env python3
"""Draft-vocabulary sweep: acceptance and draft cost for several ``--draft-vocab-size`` values.

FR-Spec trades acceptance for a cheaper draft head (``specdec_core/loading/draft_vocab.py``). This runs
the bench's own prompts (chat through the chat template) in-process, greedy, with the draft
model at a fixed k and speculation always on, once per size, on models loaded once, and prints
per size: acceptance, draft milliseconds per step, target milliseconds per step and tokens per
step. Pick the size with the best tokens per (draft + target) second.

    python clients/tools/draft_vocab_sweep.py --sizes 0,65536,32768,16384 --num-prompts 3 --max-tokens 48
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="target (default: the embedded pair)")
    p.add_argument("--draft-model", default=None)
    p.add_argument("--sizes", default="0,65536,32768,16384", help="comma list; 0 = whole vocabulary")
    p.add_argument("--kinds", default="chat,code_edit,open")
    p.add_argument("--num-prompts", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("-k", type=int, default=3, help="drafts per step (fixed)")
    args = p.parse_args()


    from specdec_core import Engine, EngineConfig, SamplingParams
    from specdec_core.engine.config import default_cache_dir
    from specdec_core.execution.device_profile import DeviceProfile
    from specdec_core.loading.loader import load_model

    load = dict(profile=DeviceProfile.decide("cpu", "float32", "none"), cache_dir=default_cache_dir(), progress=False)
    target = load_model(args.model, role="target", **load)
    draft = load_model(args.draft_model, role="draft", **load)
    data = json.loads((Path(__file__).resolve().parents[1] / "prompts.json").read_text())
    prompts = []
    for kind in args.kinds.split(","):
        for item in data[kind][: args.num_prompts]:
            prompts.append(target.tokenizer.apply_chat_template(item, add_generation_prompt=True, tokenize=False)
                           if kind == "chat" else item)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    print(f"{'size':>7} {'accept':>7} {'tok/step':>8} {'draft ms/step':>13} {'target ms/step':>14} {'tok/s':>6}")
    for size in [int(s) for s in args.sizes.split(",")]:
        cfg = EngineConfig(speculative_method="draft", num_speculative_tokens=args.k, adaptive_speculation=False,
                           draft_vocab_size=size, max_num_seqs=1, seed=0)
        eng = Engine.from_loaded(cfg, target, draft)
        eng.generate(prompts[:1], SamplingParams(max_tokens=4, temperature=0.0))  # warm-up
        m0 = (eng.metrics.total_steps, eng.metrics.total_draft_seconds, eng.metrics.total_target_seconds,
              eng.metrics.total_draft_tokens, eng.metrics.total_accepted_tokens, eng.metrics.total_generation_tokens)
        t0 = time.perf_counter()
        for prompt in prompts:  # one at a time: the c=1 case the draft head matters for
            eng.generate([prompt], params)
        wall = time.perf_counter() - t0
        m = eng.metrics
        steps = m.total_steps - m0[0]
        drafted, accepted, made = m.total_draft_tokens - m0[3], m.total_accepted_tokens - m0[4], m.total_generation_tokens - m0[5]
        print(f"{size or 'full':>7} {accepted / max(drafted, 1):7.3f} {made / steps:8.2f} "
              f"{(m.total_draft_seconds - m0[1]) / steps * 1e3:13.1f} {(m.total_target_seconds - m0[2]) / steps * 1e3:14.1f} "
              f"{made / wall:6.1f}")
        del eng


if __name__ == "__main__":
    main()
