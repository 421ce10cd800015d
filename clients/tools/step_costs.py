#!/usr/bin/env python3
"""Step-cost table: how the time of one forward grows with the tokens and requests in it.

Speculation pays only when scoring k + 1 tokens costs about what scoring one costs, so this is the
number to watch when changing the execution layer (``specdec_core/execution/linear_kernels.py``,
``native_decoder.py``). For the target and the draft, in each quantization mode, it times one
forward of ``ModelRunner`` (the engine's own), the shapes interleaved over rounds, with:

- one request verifying N tokens (1 known + N - 1 drafts), N in 1, 2, 3, 5, 9, 17, 33 (``--tokens``:
  any N, e.g. a 512-token prefill chunk);
- R requests of 1 and of 5 tokens each, R in 1, 4, 16;

every request with ``--context`` tokens already cached. Prints the median (``--stat min``: the
fastest) milliseconds and the ratio to the 1-token step, and writes JSON next to the bench results.

    python clients/tools/step_costs.py                                   # the default pair, none and int8
    python clients/tools/step_costs.py --model SmolLM2-135M-Instruct.Q4_1.gguf --modes int8
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

SINGLE_TOKENS = (1, 2, 3, 5, 9, 17, 33)
BATCHES = ((1, 1), (4, 1), (16, 1), (1, 5), (4, 5), (16, 5))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="target: HF dir, cached hub id or .gguf (default: embedded pair)")
    p.add_argument("--draft-model", default=None, help="draft (default: the embedded 0.5B with the default target)")
    p.add_argument("--modes", default="none,int8", help="comma list of quantization modes")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument("--context", type=int, default=256, help="tokens already cached per request")
    p.add_argument("--repeats", type=int, default=7, help="rounds over the shapes, one timed forward of each per round")
    p.add_argument("--stat", default="median", choices=["median", "min"],
                   help="what to report of each shape's rounds (min: on a shared, noisy machine)")
    p.add_argument("--tokens", default=",".join(map(str, SINGLE_TOKENS)),
                   help="comma list of N for the one-request shapes (a prefill chunk: e.g. 128,512)")
    p.add_argument("--out", default="bench-results", help="directory for the JSON")
    args = p.parse_args(argv)
    args.tokens = tuple(int(n) for n in args.tokens.split(","))
    if 1 not in args.tokens or 5 not in args.tokens:
        p.error("--tokens must include 1 and 5 (the table's last column is their ratio)")
    return args


def time_shapes(runner, shapes: dict[str, list], repeats: int, stat: str) -> dict[str, float]:
    """Milliseconds of ``runner.forward(items)`` per shape: each shape warmed up once, then
    ``repeats`` rounds over all shapes, one timed forward of each per round, and the rounds'
    ``stat`` (median or min). Interleaved because on a shared machine a slow spell of a few
    seconds over one shape's back-to-back runs made it look as cheap or dear as its neighbours."""
    import torch

    def sync() -> None:
        if runner.device.type == "cuda":
            torch.cuda.synchronize()

    for items in shapes.values():
        runner.forward(items)
        sync()
    times: dict[str, list[float]] = {name: [] for name in shapes}
    for _ in range(repeats):
        for name, items in shapes.items():
            t0 = time.perf_counter()
            runner.forward(items)
            sync()
            times[name].append((time.perf_counter() - t0) * 1e3)
    pick = min if stat == "min" else statistics.median
    return {name: pick(t) for name, t in times.items()}


def measure(loaded, quantize: str, context: int, tokens: tuple[int, ...], repeats: int, stat: str) -> dict[str, float]:
    from specdec_core.execution.device_profile import DeviceProfile
    from specdec_core.execution.forward_plan import ForwardItem
    from specdec_core.execution.kv_cache import blocks_for, region
    from specdec_core.execution.model_runner import ModelRunner

    vocab = loaded.model.get_output_embeddings().weight.shape[0]
    room = context + max(tokens) + 8  # each request's slot: its cached tokens and its longest shape
    runner = ModelRunner(loaded.model, num_blocks=16 * blocks_for(room, 16),
                         block_size=16, max_len=room, vocab_size=vocab,
                         profile=DeviceProfile.of_model(loaded.model, quantize))

    def item(slot: int, n: int) -> ForwardItem:
        return ForwardItem(region(slot, room, 16), context, [17 + j for j in range(n)], n, num_drafts=n - 1)

    shapes = {f"1x{n}": [item(0, n)] for n in tokens}
    for reqs, n in BATCHES:
        shapes.setdefault(f"{reqs}x{n}", [item(s, n) for s in range(reqs)])
    costs: dict[str, float] = time_shapes(runner, shapes, repeats, stat)
    costs["path"] = runner.path  # type: ignore[assignment]
    del runner
    gc.collect()
    return costs


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    repo_root = str(Path(__file__).resolve().parents[2])
    if repo_root not in sys.path:
        sys.path.append(repo_root)
    import torch

    from specdec_core.engine.config import default_cache_dir
    from specdec_core.execution.device_profile import DeviceProfile
    from specdec_core.loading.loader import load_model

    device = DeviceProfile.decide(args.device, args.dtype, "none").device
    modes = [DeviceProfile.decide(device, args.dtype, m).kernels for m in args.modes.split(",")]
    roles = {"target": args.model}
    if args.model is None or args.draft_model:
        roles["draft"] = args.draft_model
    table: dict[str, dict[str, dict[str, float]]] = {}
    for role, source in roles.items():
        for mode in modes:  # loaded for each mode, as a server of that mode loads it (gguf: the file's own blocks)
            loaded = load_model(source, role=role, profile=DeviceProfile.decide(device, args.dtype, mode),
                                cache_dir=default_cache_dir(), progress=True)
            print(f"timing {role} {loaded.name} quantize={mode} ...", file=sys.stderr, flush=True)
            table[f"{role} {loaded.name} {mode}"] = measure(loaded, mode, args.context, args.tokens, args.repeats, args.stat)
            del loaded
            gc.collect()

    shapes = [f"1x{n}" for n in args.tokens] + [f"{r}x{n}" for r, n in BATCHES if r > 1]
    print(f"\n{args.stat} ms per forward over {args.repeats} interleaved rounds, {args.context} tokens cached per request;"
          f" 'RxN' = R requests of N tokens (1 known + N-1 drafts); torch {torch.__version__},"
          f" {torch.get_num_threads()} threads, {device}")
    print("| model, mode | path | " + " | ".join(shapes) + " | 5 tok / 1 tok |")
    print("|---" * (len(shapes) + 3) + "|")
    for name, costs in table.items():
        cells = " | ".join(f"{costs[s]:.1f}" for s in shapes)
        print(f"| {name} | {costs['path']} | {cells} | {costs['1x5'] / costs['1x1']:.2f} |")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"step-costs-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps({"context": args.context, "repeats": args.repeats, "stat": args.stat, "device": str(device),
                                "threads": torch.get_num_threads(), "table": table}, indent=1))
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
