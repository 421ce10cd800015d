#!/usr/bin/env python3
"""What a quantized CPU mode costs in quality: gguf or int8 vs fp32 next-token agreement and KL, teacher-forced.

The CPU modes (``--quantize gguf``, the default: a GGUF model's own blocks, Q8_0 blocks made at
load for any other model, and ``int8``, per-row int8, an opt-in) are lossless with respect to their
own quantized model.
This measures how far that model is from fp32 on real text: for every position of a text built from
``clients/prompts.json`` (code-editing prompts, open prompts and chat prompts through the chat
template, each followed by the fp32 model's own greedy continuation), the share of positions where
both modes pick the same top-1 token, and the mean KL(fp32 || mode) in nats. Both modes run
through the engine's own ``ModelRunner``.

    python clients/tools/quant_quality.py                      # the default pair (target and draft), gguf
    python clients/tools/quant_quality.py --model SmolLM2-135M-Instruct.Q4_1.gguf --mode int8
    python clients/tools/quant_quality.py --model DIR          # a safetensors model: Q8_0 blocks made at load
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

PROMPTS_FILE = Path(__file__).resolve().parents[1] / "prompts.json"


def texts(tokenizer, per_kind: int) -> list[list[int]]:
    data = json.loads(PROMPTS_FILE.read_text())
    out = []
    for kind in ("code_edit", "open", "chat"):
        for prompt in data[kind][:per_kind]:
            if isinstance(prompt, list):
                prompt = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
            out.append(tokenizer.encode(prompt))
    return out


def compare(loaded, per_kind: int, continue_tokens: int, mode: str = "gguf") -> dict[str, float]:
    import torch

    from specdec_core.execution.device_profile import DeviceProfile
    from specdec_core.execution.forward_plan import ForwardItem
    from specdec_core.execution.kv_cache import blocks_for, region
    from specdec_core.execution.model_runner import ModelRunner

    vocab = loaded.model.get_output_embeddings().weight.shape[0]
    runners = {m: ModelRunner(loaded.model, num_blocks=blocks_for(2048, 16),
                               block_size=16, max_len=2048, vocab_size=vocab, profile=DeviceProfile.of_model(loaded.model, m))
               for m in ("none", mode)}
    agree = kl = positions = 0.0
    for ids in texts(loaded.tokenizer, per_kind):
        seq = list(ids)
        logits = runners["none"].forward([ForwardItem(region(0, 2048, 16), 0, seq, 1)])
        for _ in range(continue_tokens):  # the fp32 model's own greedy continuation, decoded on its cache
            seq.append(int(logits[0].argmax()))
            logits = runners["none"].forward([ForwardItem(region(0, 2048, 16), len(seq) - 1, seq[-1:], 1)])
        fp32 = runners["none"].forward([ForwardItem(region(0, 2048, 16), 0, seq, len(seq))])
        quant = runners[mode].forward([ForwardItem(region(0, 2048, 16), 0, seq, len(seq))])
        lp, lq = torch.log_softmax(fp32, -1), torch.log_softmax(quant, -1)
        agree += (fp32.argmax(-1) == quant.argmax(-1)).sum().item()
        kl += (lp.exp() * (lp - lq)).sum(-1).sum().item()
        positions += len(seq)
    return {"positions": positions, "top1_agreement": agree / positions, "kl_nats": kl / positions}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="target (default: the embedded pair, both models)")
    p.add_argument("--per-kind", type=int, default=3, help="prompts per kind")
    p.add_argument("--continue-tokens", type=int, default=24, help="greedy fp32 tokens appended to each prompt")
    p.add_argument("--mode", default="gguf", choices=["gguf", "int8"], help="the quantized mode compared with fp32")
    args = p.parse_args(argv)
    repo_root = str(Path(__file__).resolve().parents[2])
    if repo_root not in sys.path:
        sys.path.append(repo_root)
    from specdec_core.engine.config import default_cache_dir
    from specdec_core.execution.device_profile import DeviceProfile
    from specdec_core.loading.loader import load_model

    roles = {"target": args.model} if args.model else {"target": None, "draft": None}
    print(f"| model | positions | top-1 agreement {args.mode} vs fp32 | mean KL(fp32 ‖ {args.mode}), nats |")
    print("|---|---|---|---|")
    for role, source in roles.items():
        loaded = load_model(source, role=role, profile=DeviceProfile.decide("cpu", "float32", "none"),
                            cache_dir=default_cache_dir(), progress=False)
        r = compare(loaded, args.per_kind, args.continue_tokens, args.mode)
        print(f"| {loaded.name} | {r['positions']:.0f} | {r['top1_agreement']:.3f} | {r['kl_nats']:.4f} |", flush=True)
        del loaded
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
