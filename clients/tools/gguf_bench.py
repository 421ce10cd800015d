#!/usr/bin/env python3
"""GGUF block kernels against per-row int8 (fbgemm), in one process, calls interleaved.

The machine this was written on is shared, so every measurement alternates the kernels call by
call and reports the median and the minimum of each: a ratio is only meaningful within one run.

- layer: one [8960 x 1536] weight (the 1.5B's MLP up-projection), Q4_K and Q6_K blocks against
  the int8 layer, M = 1, 5, 16 rows; milliseconds and GB/s of weight bytes read. Each call uses
  the next of several copies (>= 96 MB in all), so the weights come from DRAM as in a model step,
  not from the last-level cache (7.7 MB of Q4_K fits in it);
- step (``--model``, default the embedded target): one forward of ``ModelRunner`` with
  ``quantize=int8`` and ``quantize=gguf`` over the same model: 1 token, 1 known + 4 drafts, and
  16 requests of 1 token, each with ``--context`` tokens cached; plus the step's bytes of weights
  over the measured one-row GB/s of the layer (the bandwidth floor).

    python clients/tools/gguf_bench.py --layer-only
    python clients/tools/gguf_bench.py --model SmolLM2-135M-Instruct.Q4_1.gguf
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    import torch

SHAPE = (8960, 1536)


def interleaved(calls: dict[str, Callable[[], object]], repeats: int) -> dict[str, tuple[float, float]]:
    """(median, min) milliseconds of each call, the calls alternating, after one warm-up each."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for fn in calls.values():
        fn()
    for _ in range(repeats):
        for name, fn in calls.items():
            t0 = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - t0) * 1e3)
    return {name: (statistics.median(t), min(t)) for name, t in times.items()}


def layer_bench(repeats: int) -> tuple[float, Callable[[torch.Tensor], object], int]:
    """Prints the layer table; returns the one-row Q4_K GB/s (the bandwidth reference), and a
    call of the next Q4_K copy with its bytes (``step_bench`` streams the step's bytes through
    it, interleaved with the steps)."""
    import numpy as np
    import torch
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    from specdec_core.execution.gguf_linear import BlockWeight, GGUFLinear
    from specdec_core.execution.linear_kernels import prepare_linear

    n, k = SHAPE
    rng = np.random.default_rng(0)
    copies: dict[str, list[torch.nn.Module]] = {"int8": [prepare_linear(torch.randn(n, k), None, "int8")
                                                          for _ in range(-(-(96 << 20) // (n * k)))]}
    nbytes = {"int8": n * k}
    for qtype in (GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q6_K):
        block, size = GGML_QUANT_SIZES[qtype]
        raw = rng.integers(0, 256, size=(n, k // block, size), dtype=np.uint8)
        # small positive fp16 scales (Q6_K: d; Q4_K: d and dmin): random ones can be inf or NaN
        scales = slice(208, 210) if qtype == GGMLQuantizationType.Q6_K else slice(0, 4)
        raw[..., scales] = 0x10
        weight = BlockWeight(int(qtype), torch.from_numpy(raw.reshape(n, -1)), k)
        copies[qtype.name] = [GGUFLinear([weight], None) for _ in range(-(-(96 << 20) // raw.size))]
        nbytes[qtype.name] = raw.size
    turn = dict.fromkeys(copies, 0)

    def call(name: str, x: torch.Tensor) -> torch.Tensor:
        turn[name] = (turn[name] + 1) % len(copies[name])
        return copies[name][turn[name]](x)

    print(f"\nlayer [{n} x {k}], ms per call, median (min), GB/s of weights at the median; "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("| M | " + " | ".join(copies) + " | Q4_K / int8 | Q6_K / int8 |")
    print("|---" * (len(copies) + 3) + "|")
    best_gbs = 0.0
    for m in (1, 5, 16):
        x = torch.randn(m, k)
        res = interleaved({name: (lambda name=name, x=x: call(name, x)) for name in copies}, repeats)
        cells = " | ".join(f"{res[name][0]:.3f} ({res[name][1]:.3f}), {nbytes[name] / res[name][0] / 1e6:.1f} GB/s"
                           for name in copies)
        ratios = " | ".join(f"{res[q][0] / res['int8'][0]:.2f}" for q in ("Q4_K", "Q6_K"))
        print(f"| {m} | {cells} | {ratios} |", flush=True)
        if m == 1:
            best_gbs = nbytes["Q4_K"] / res["Q4_K"][0] / 1e6
    return best_gbs, lambda x: call("Q4_K", x), nbytes["Q4_K"]


def step_bench(source: str | None, context: int, repeats: int, gbs: float,
               probe: Callable[[torch.Tensor], object], probe_bytes: int) -> None:
    import torch

    from specdec_core.engine.config import default_cache_dir
    from specdec_core.execution.device_profile import DeviceProfile
    from specdec_core.execution.forward_plan import ForwardItem
    from specdec_core.execution.gguf_linear import GGUFLinear
    from specdec_core.execution.kv_cache import blocks_for, region
    from specdec_core.execution.linear_kernels import RowInt8Linear
    from specdec_core.execution.model_runner import ModelRunner
    from specdec_core.kernels import c_library
    from specdec_core.loading.loader import load_model

    loaded = load_model(source, role="target", profile=DeviceProfile.decide("cpu", "float32", "none"),
                        cache_dir=default_cache_dir(), progress=True)
    vocab = loaded.model.get_output_embeddings().weight.shape[0]
    runners: dict[str, ModelRunner] = {}
    prepare_s: dict[str, float] = {}
    for mode in ("int8", "gguf"):
        t0 = time.perf_counter()
        runners[mode] = ModelRunner(loaded.model, num_blocks=16 * blocks_for(context + 8, 16),
                                     block_size=16, max_len=context + 8, vocab_size=vocab,
                                     profile=DeviceProfile.of_model(loaded.model, mode))
        prepare_s[mode] = time.perf_counter() - t0
    prompt = [17 + (i % 500) for i in range(context)]
    for run in runners.values():
        for slot in range(16):
            run.forward([ForwardItem(region(slot, context + 8, 16), 0, prompt, 1)])

    def read_bytes(run: ModelRunner) -> int:
        total = 0
        for layer in run.native.modules():
            if isinstance(layer, GGUFLinear):
                total += layer.weight_bytes
            elif isinstance(layer, RowInt8Linear):
                total += layer.in_features * layer.out_features
        return total

    shapes = {"1 token": [ForwardItem(region(0, context + 8, 16), context, [5], 1)],
              "1 + 4 drafts": [ForwardItem(region(0, context + 8, 16), context, [5, 6, 7, 8, 9], 5, num_drafts=4)],
              "16 x 1 token": [ForwardItem(region(s, context + 8, 16), context, [5], 1) for s in range(16)]}
    print(f"\nstep of {loaded.name} ({context} tokens cached), ms median (min); weights read per step: "
          + ", ".join(f"{m} {read_bytes(r) / 1e9:.3f} GB" for m, r in runners.items())
          + "; preparing the runner: " + ", ".join(f"{m} {s:.1f} s" for m, s in prepare_s.items()))
    print("(gguf runs on torch's OpenMP team; \"gguf, own pool\" on a thread pool of the kernels' own, which "
          "shares the cores with torch's idle OpenMP workers while they spin)")
    print("| shape | int8 | gguf | gguf, own pool | gguf / int8 |\n|---|---|---|---|---|")
    one: dict[str, float] = {}

    def on_pool(own: bool, items: list[ForwardItem]) -> None:
        c_library.thread_pool(own=own)
        runners["gguf"].forward(items)

    for label, items in shapes.items():
        res = interleaved({"int8": lambda items=items: runners["int8"].forward(items),
                           "gguf": lambda items=items: on_pool(False, items),
                           "own": lambda items=items: on_pool(True, items)}, repeats)
        c_library.thread_pool(own=False)
        one.setdefault("int8", res["int8"][0])
        one.setdefault("gguf", res["gguf"][0])
        print(f"| {label} | " + " | ".join(f"{res[m][0]:.1f} ({res[m][1]:.1f})" for m in ("int8", "gguf", "own"))
              + f" | {res['gguf'][0] / res['int8'][0]:.2f} |", flush=True)
    # The floor in the same minutes as the step: the step's bytes streamed through one-row Q4_K
    # calls (the layer table's), alternating with one-token steps. On this shared machine the
    # bandwidth drifts by 30% between minutes, so a floor taken before the steps is not theirs.
    calls = -(-read_bytes(runners["gguf"]) // probe_bytes)
    x1 = torch.randn(1, SHAPE[1])
    paired = interleaved({"step": lambda: runners["gguf"].forward(shapes["1 token"]),
                          "floor": lambda: [probe(x1) for _ in range(calls)]}, repeats)
    print(f"\ninterleaved: gguf one-token step {paired['step'][0]:.1f} ms, the same bytes through {calls} "
          f"one-row Q4_K layer calls {paired['floor'][0]:.1f} ms: step / floor = {paired['step'][0] / paired['floor'][0]:.2f}")
    floor = read_bytes(runners["gguf"]) / gbs / 1e6
    print(f"gguf one-token step {one['gguf']:.1f} ms; bytes / layer GB/s ({gbs:.1f}) = {floor:.1f} ms; "
          f"step / floor = {one['gguf'] / floor:.2f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="target for the step table (default: the embedded target)")
    p.add_argument("--layer-only", action="store_true", help="only the layer table")
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--threads", type=int, default=None, help="torch threads (the block kernels use as many)")
    args = p.parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    repo_root = str(Path(__file__).resolve().parents[2])
    if repo_root not in sys.path:
        sys.path.insert(0, repo_root)
    gbs, probe, probe_bytes = layer_bench(args.repeats)
    if not args.layer_only:
        step_bench(args.model, args.context, max(5, args.repeats // 3), gbs, probe, probe_bytes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
