#!/usr/bin/env python3
"""The step on a real GPU: launches, host synchronisations, step times and greedy agreement.

``clients/tools/step_counts.py`` counts the device path's ops on the CPU; this runs the same engine on
CUDA and reads what the GPU actually did. It builds random-weight models of the default pair's
real shapes (Qwen2.5-Coder 1.5B target, 0.5B draft: only the weights are random, so every
matrix, cache and graph has the size it has in production) from their ``config.json`` and a real
tokenizer, then, for batch sizes 1 and 16:

- **steady steps** with a fixed k (adaptive speculation off), decode graphs off and on: the
  median step time, and for one step the CUDA runtime calls (kernel launches, graph launches,
  copies: ``torch.profiler``), the GPU's busy time inside it, and the host synchronisations
  (``torch.cuda.set_sync_debug_mode``), beside the ops ``step_counts`` counts for the same step;
- **greedy agreement** of every configuration's tokens with plain eager decoding's (cuBLAS does
  not promise batch-invariant rows, so near-ties may differ; the script says how many requests
  agree and where the first disagreement is);
- **throughput** of each speculation method as users run it (adaptive, graphs as ``auto``), and
  the cost table the engine measured at start-up.

    python clients/tools/cuda_check.py --configs DIR --json out.json

``DIR`` holds ``target/`` and ``draft/`` with ``config.json`` and tokenizer files (the default
pair's, copied from a converted model cache). Needs a CUDA device.
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # run as `python clients/tools/cuda_check.py`: the checkout's packages import
    sys.path.insert(0, str(REPO))

from clients.tools.step_counts import counting  # noqa: E402

# CUDA runtime/driver calls that put work on the device's queue.
LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch",
            "cudaMemcpyAsync", "cudaMemsetAsync")
PROMPT = ("Refactor this function so that it reads the file once and returns the parsed rows; keep the "
          "error handling.\n\n```python\n" + "def load(path):\n    rows = []\n    with open(path) as f:\n"
          "        for line in f:\n            rows.append(line.strip().split(','))\n    return rows\n" * 6 + "```\n")


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def build_models(configs: Path, out: Path, device: str, tiny: bool = False, seed: int = 0) -> dict[str, Path]:
    """Random weights in the real shapes (``tiny``: 64 wide, to try the script on a CPU), saved in
    bf16 beside the real tokenizer files."""
    from transformers import AutoConfig, AutoModelForCausalLM

    paths = {}
    for role in ("target", "draft"):
        cfg = AutoConfig.from_pretrained(configs / role)
        if tiny:
            cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads, cfg.num_hidden_layers = 64, 128, 4, 2
            cfg.num_key_value_heads = 2
            if getattr(cfg, "layer_types", None):
                cfg.layer_types = cfg.layer_types[:2]
        torch.manual_seed(seed)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
        path = out / role
        model.save_pretrained(path)
        for f in (configs / role).iterdir():
            if f.name != "config.json" and not f.name.startswith("model"):  # tokenizer files, not weights
                shutil.copy(f, path / f.name)
        if not (path / "tokenizer.json").exists():
            shutil.copy(configs / "target" / "tokenizer.json", path / "tokenizer.json")
        paths[role] = path
        del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return paths


def make_engine(models: dict[str, Any], method: str, batch: int, k: int, graphs: str, adaptive: bool,
                cache_dir: Path, device: str) -> Any:
    from specdec_core.engine.config import EngineConfig
    from specdec_core.engine.engine import Engine

    config = EngineConfig(model=str(models["target"].path), draft_model=str(models["draft"].path), device=device,
                          dtype="bfloat16", quantize="none", max_num_seqs=batch, max_model_len=1024,
                          kv_cache_memory="4GiB", speculative_method=method, num_speculative_tokens=max(k, 1),
                          adaptive_speculation=adaptive, seed=0, decode_graphs=graphs, cache_dir=cache_dir,
                          attention="packed")
    return Engine.from_loaded(config, models["target"], models["draft"] if method in ("draft", "auto") else None)


class CaptureClock:
    """Counts and times CUDA graph captures (``DecodeGraphs._capture``) inside ``with``."""

    def __init__(self) -> None:
        self.count, self.seconds = 0, 0.0

    def __enter__(self) -> CaptureClock:
        from specdec_core.execution.decode_graphs import DecodeGraphs

        self._real = real = DecodeGraphs._capture

        def timed(graphs: Any, *args: Any) -> None:
            t0 = time.perf_counter()
            try:
                real(graphs, *args)
            finally:
                self.count += 1
                self.seconds += time.perf_counter() - t0
        DecodeGraphs._capture = timed  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        from specdec_core.execution.decode_graphs import DecodeGraphs

        DecodeGraphs._capture = self._real  # type: ignore[method-assign]

    def take(self) -> tuple[int, float]:
        out = (self.count, self.seconds)
        self.count, self.seconds = 0, 0.0
        return out


def run(engine: Any, batch: int, max_tokens: int, device: str, probe_at: int | None = None,
        logprobs: bool = False) -> dict[str, Any]:
    """Serve ``batch`` greedy requests to the end, timing every step; at step ``probe_at`` (steady
    by then) profile one step, count one step's syncs and one step's ops. ``logprobs``: also
    return each token's top-1 minus top-2 log-probability (how near a tie it was)."""
    from specdec_core.decoding.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, logprobs=2 if logprobs else None)
    margins: dict[str, list[float]] = {f"r{i}": [] for i in range(batch)}
    prompt = engine.tokenizer.encode(PROMPT)
    for i in range(batch):
        engine.add_request(engine.make_request(prompt[i:], params, request_id=f"r{i}"))
    tokens: dict[str, list[int]] = {f"r{i}": [] for i in range(batch)}
    steps: list[float] = []
    probe: dict[str, Any] = {}
    drafted = accepted = 0
    start = time.perf_counter()
    while engine.has_unfinished():
        n = len(steps)
        if probe_at is not None and n in (probe_at, probe_at + 1, probe_at + 2):
            outs = _probe(engine, n - probe_at, probe, device)
            steps.append(float("nan"))
        else:
            sync(device)
            t0 = time.perf_counter()
            outs = engine.step()
            sync(device)
            steps.append(time.perf_counter() - t0)
        for o in outs:
            tokens[o.request_id].extend(o.token_ids)
            margins[o.request_id] += [t.top[0][1] - t.top[1][1] for t in o.logprobs or ()]
            if o.finished and o.stats is not None:
                drafted += o.stats.draft_tokens
                accepted += o.stats.accepted_tokens
    wall = time.perf_counter() - start
    steady = [s for s in steps[4:] if s == s]
    total = sum(len(t) for t in tokens.values())
    slow = sorted(((s, i) for i, s in enumerate(steps) if s == s), reverse=True)[:5]
    return {"tokens": tokens, "margins": margins, "completion_tokens": total, "steps": len(steps),
            "slowest_steps": [(i, round(1000 * s, 1)) for s, i in slow], "wall_s": wall, "tok_per_s": total / wall,
            "step_ms_median": 1000 * statistics.median(steady) if steady else None,
            "step_ms_min": 1000 * min(steady) if steady else None,
            "acceptance": accepted / drafted if drafted else None, **probe}


def _probe(engine: Any, which: int, probe: dict[str, Any], device: str) -> list[Any]:
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    sync(device)
    if which == 0:
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
        with profile(activities=activities) as prof:
            outs = engine.step()
            sync(device)
        events = list(prof.events())
        api = Counter(e.name for e in events if e.device_type == DeviceType.CPU and e.name.startswith(("cuda", "cu")))
        kernels = [e for e in events if e.device_type == DeviceType.CUDA]
        probe["launches"] = sum(api[name] for name in LAUNCHES)
        probe["graph_launches"] = api["cudaGraphLaunch"]
        probe["runtime_calls"] = dict(api.most_common(12))
        probe["gpu_kernels"] = len(kernels)
        probe["gpu_busy_ms"] = sum(e.time_range.elapsed_us() for e in kernels) / 1000
        return outs
    if which == 1 and device == "cuda":
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                outs = engine.step()
                torch.cuda.synchronize()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        syncs = [str(w.message).splitlines()[0] for w in caught if "synchroniz" in str(w.message)]
        probe["host_syncs"] = len(syncs)
        probe["sync_kinds"] = dict(Counter(syncs).most_common(5))
        return outs
    with counting() as counts:
        outs = engine.step()
    probe["counted_ops"], probe["counted_round_trips"] = counts.ops, counts.host_reads
    return outs


def agreement(ref: dict[str, list[int]], other: dict[str, list[int]],
              margins: dict[str, list[float]] | None = None) -> dict[str, Any]:
    """How many requests' greedy tokens equal the reference's, where the first differences are
    and (``margins``: the reference's top-1 minus top-2 log-probability per token) how near a tie
    the reference's token was there, beside the median margin of all its tokens."""
    firsts, at_difference = [], []
    for rid, want in ref.items():
        got = other[rid]
        diff = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), None)
        if diff is None and len(want) != len(got):
            diff = min(len(want), len(got))
        if diff is not None:
            firsts.append(diff)
            if margins and diff < len(margins[rid]):
                at_difference.append(round(margins[rid][diff], 4))
    out: dict[str, Any] = {"identical": len(ref) - len(firsts), "of": len(ref), "first_difference_at": sorted(firsts)[:8]}
    if margins:
        every = [m for ms in margins.values() for m in ms]
        out["margin_at_differences"] = sorted(at_difference)
        out["margin_median"] = round(statistics.median(every), 4) if every else None
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", type=Path, required=True, help="DIR with target/ and draft/ config and tokenizer files")
    p.add_argument("--json", type=Path, default=None, help="write every number here")
    p.add_argument("--batches", default="1,16")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--models-dir", type=Path, default=None, help="build the random models here and keep them "
                   "(e.g. for a server: --model DIR/target --draft-model DIR/draft); default: a temporary directory")
    p.add_argument("--adaptive-only", action="store_true", help="only the methods as users run them (no fixed-k "
                   "steady steps, probes or logprob margins)")
    p.add_argument("--tiny", action="store_true", help="64-wide models on the CPU: to try the script without a GPU")
    args = p.parse_args(argv)
    device = "cpu" if args.tiny else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device (or --tiny)")
    from specdec_core.execution.device_profile import DeviceProfile
    from specdec_core.loading.loader import load_model

    report: dict[str, Any] = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                              "torch": torch.__version__, "cuda": torch.version.cuda}
    print(json.dumps(report), flush=True)
    with tempfile.TemporaryDirectory() as tmp, CaptureClock() as captures:
        paths = build_models(args.configs, args.models_dir or Path(tmp), device, args.tiny)
        models = {role: load_model(str(path), role=role, profile=DeviceProfile.decide(device, "bfloat16", "none"),
                                   cache_dir=Path(tmp),
                                   progress=False) for role, path in paths.items()}
        rows = []
        for batch in (int(b) for b in args.batches.split(",")):
            ref: dict[str, list[int]] | None = None
            ref_margins: dict[str, list[float]] | None = None
            # steady steps, fixed k, graphs off and on; then methods as users run them (adaptive, graphs auto)
            plan = [("none", 0, "off", False), ("none", 0, "off", "logprobs"), ("none", 0, "on", False), ("draft", 4, "off", False),
                    ("draft", 4, "on", False), ("ngram", 4, "on", False),
                    ("none", 0, "auto", True), ("ngram", 4, "auto", True), ("draft", 4, "auto", True),
                    ("auto", 4, "auto", True)]
            if args.adaptive_only:
                plan = [row for row in plan if row[3] is True]
            for method, k, graphs, adaptive in plan:
                engine = make_engine(models, method, batch, k, graphs, adaptive is True, Path(tmp) / "costs", device)
                at_start = captures.take()
                try:
                    r = run(engine, batch, args.max_tokens, device, probe_at=None if adaptive else 10,
                            logprobs=adaptive == "logprobs")
                    costs = engine.step_costs.costs.describe() if method == "auto" else None
                finally:
                    del engine
                    gc.collect()
                    if device == "cuda":
                        torch.cuda.empty_cache()
                tokens, margins = r.pop("tokens"), r.pop("margins")
                if ref is None:
                    ref = tokens
                if adaptive == "logprobs":
                    ref_margins = margins
                serving = captures.take()
                row = {"batch": batch, "method": method, "k": k, "graphs": graphs, "adaptive": adaptive, **r,
                       "captures_at_start": at_start[0], "captures_serving": serving[0],
                       "capture_s": round(at_start[1] + serving[1], 2), "agreement": agreement(ref, tokens, ref_margins)}
                if costs:
                    row["costs"] = costs
                rows.append(row)
                print(json.dumps(row), flush=True)
        report["rows"] = rows
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    print("\nB   method k graphs adaptive  step ms (med/min)  tok/s   launches graph  syncs  counted ops/trips  "
          "gpu busy ms  agree  acceptance  captures start/serving")
    for r in rows:
        print(f"{r['batch']:<3} {r['method']:<6} {r['k']} {r['graphs']:<6} {str(r['adaptive']):<8} "
              f"{r['step_ms_median'] or 0:7.2f}/{r['step_ms_min'] or 0:6.2f}  {r['tok_per_s']:7.1f}  "
              f"{r.get('launches', '-')!s:>6} {r.get('graph_launches', '-')!s:>4}  {r.get('host_syncs', '-')!s:>4}  "
              f"{r.get('counted_ops', '-')!s:>6}/{r.get('counted_round_trips', '-')!s:<4}  "
              f"{r.get('gpu_busy_ms', 0):8.2f}  {r['agreement']['identical']}/{r['agreement']['of']}  "
              f"{'-' if r['acceptance'] is None else format(r['acceptance'], '.2f')}  "
              f"{r['captures_at_start']}/{r['captures_serving']} ({r['capture_s']} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
