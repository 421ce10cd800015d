#!/usr/bin/env python3
"""Where the price of a verified row goes: one target forward of one request with R rows (1 known
token + R - 1 drafts, logits for all), timed per component, for each R.

The speculation goals hinge on what a verify step of 1 + k rows costs against one row
(``StepCostModel``). This splits that step into its parts: the attention projections (``qkv``,
``o``), the attention block (RoPE, the K/V writes and the attention call), the MLP (``gate_up``,
``down``), the head, and the rest (norms, embedding, residuals, Python), each the median over
``--repeats`` forwards, timed through torch's forward hooks on the decoder's own modules. A part whose time grows
with R is compute-bound there; one that stays flat is bound by reading its weights.

The hooks need the per-op layers, so the split is of that path; the CPU default runs the layers
as one C call (``execution/row_layers.py``): the ``one call`` column, beside the per-op path
without the hooks (``per-op``) and with them (``per-op, hooked``, the step the parts split).

    python clients/tools/row_profile.py                   # the embedded target, gguf, rows 1..9
    python clients/tools/row_profile.py --rows 1,6 --threads 1          # compute-bound parts double
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

PARTS = ("qkv", "o", "gate_up", "down")


def instrument(native: Any, totals: dict[str, float]) -> list[Any]:
    """Time the decoder's linear layers and its head through torch's forward hooks (nothing of the
    engine is replaced, so what is timed is the code that serves), and the attention block as the
    gap between a layer's ``qkv`` returning and its ``o`` starting: RoPE, the K/V writes and the
    attention call itself. Returns the hooks' handles."""
    started: dict[str, float] = {}

    def before(name: str) -> Callable[..., None]:
        def hook(module: Any, args: Any) -> None:
            now = time.perf_counter()
            if name == "o":
                totals["attention"] += now - started.pop("attention", now)
            started[name] = now
        return hook

    def after(name: str) -> Callable[..., None]:
        def hook(module: Any, args: Any, output: Any) -> None:
            now = time.perf_counter()
            totals[name] += now - started.pop(name)
            if name == "qkv":
                started["attention"] = now
        return hook

    modules = [(name, getattr(layer, name)) for layer in native.layers for name in PARTS]
    modules.append(("head", native.lm_head))
    handles = []
    for name, module in modules:
        handles += [module.register_forward_pre_hook(before(name)), module.register_forward_hook(after(name))]
    return handles


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="target (default: the embedded target)")
    p.add_argument("--quantize", default="gguf", choices=["gguf", "int8", "none"])
    p.add_argument("--rows", default="1,2,3,4,5,6,7,8,9", help="comma list of rows per forward")
    p.add_argument("--context", type=int, default=128, help="tokens cached before the rows")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads (the block kernels use as many): a part that is twice as slow on one "
                        "thread as on two is compute-bound")
    args = p.parse_args(argv)
    repo_root = str(Path(__file__).resolve().parents[2])
    if repo_root not in sys.path:
        sys.path.insert(0, repo_root)
    import torch

    from specdec_core.engine.config import default_cache_dir
    from specdec_core.execution.device_profile import DeviceProfile
    from specdec_core.execution.forward_plan import ForwardItem
    from specdec_core.execution.kv_cache import blocks_for, region
    from specdec_core.execution.model_runner import ModelRunner
    from specdec_core.loading.loader import load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    rows = [int(r) for r in args.rows.split(",")]
    span = args.context + max(rows) + 8
    loaded = load_model(args.model, role="target", profile=DeviceProfile.decide("cpu", "float32", "none"),
                        cache_dir=default_cache_dir())
    vocab = loaded.model.get_output_embeddings().weight.shape[0]
    runner = ModelRunner(loaded.model, num_blocks=blocks_for(span, 16), block_size=16, max_len=span,
                         vocab_size=vocab, profile=DeviceProfile.of_model(loaded.model, args.quantize))
    if runner.native is None:
        raise SystemExit(f"{loaded.name} does not run on the native path; nothing to split")
    blocks = region(0, span, 16)
    runner.forward([ForwardItem(blocks, 0, [17 + i % 500 for i in range(args.context)], 1)])
    one_call = runner.native.row_layers
    totals: dict[str, float] = defaultdict(float)
    names = ["qkv", "attention", "o", "gate_up", "down", "head"]
    print(f"{loaded.name}, quantize={args.quantize}, {args.context} tokens cached, {torch.get_num_threads()} threads; "
          f"ms, median of {args.repeats}; the parts are of the per-op layers")
    print("| rows | one call | per-op | per-op, hooked | " + " | ".join(names) + " | rest |\n"
          + "|---" * (len(names) + 5) + "|")

    def timed(native_stack: Any, hooked: bool) -> float:
        runner.native.row_layers = native_stack
        handles = instrument(runner.native, totals) if hooked else []
        totals.clear()
        start = time.perf_counter()
        runner.forward(items)
        seconds = time.perf_counter() - start
        for handle in handles:
            handle.remove()
        return seconds

    for r in rows:
        items = [ForwardItem(blocks, args.context, list(range(5, 5 + r)), r, num_drafts=r - 1)]
        runner.forward(items)
        steps: dict[str, list[float]] = defaultdict(list)
        parts = defaultdict(list)
        for _ in range(args.repeats):  # the three interleaved: the path that serves, the per-op one, its split
            if one_call is not None:
                steps["one call"].append(timed(one_call, hooked=False))
            steps["per-op"].append(timed(None, hooked=False))
            steps["hooked"].append(timed(None, hooked=True))
            for name in names:
                parts[name].append(totals[name])
        ms = {name: f"{statistics.median(t) * 1e3:.1f}" for name, t in steps.items()}
        step = statistics.median(steps["hooked"]) * 1e3
        cells = [statistics.median(parts[name]) * 1e3 for name in names]
        print(f"| {r} | {ms.get('one call', '-')} | {ms['per-op']} | {step:.1f} | " + " | ".join(f"{c:.1f}" for c in cells)
              + f" | {step - sum(cells):.1f} |", flush=True)
    runner.native.row_layers = one_call
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
