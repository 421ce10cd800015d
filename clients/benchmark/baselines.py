"""Same-run transformers baselines at concurrency 1: ``generate()``, assisted generation with the
draft model and prompt lookup, on the same prompts and models as the servers."""

from __future__ import annotations

import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .progress import log, progress
from .report import Row, fmt, summarize
from .results import RequestResult
from .workload import Workload

REPO_ROOT = Path(__file__).resolve().parents[2]


def _load_pair(args, need_draft: bool):
    """Target (and draft) through specdec's own loader (converted-weights cache, same EOS rule and
    the same quantization choice as the servers; the repository root is put on ``sys.path`` so a
    checkout without ``pip install -e .`` works)."""
    if str(REPO_ROOT) not in sys.path:
        sys.path.append(str(REPO_ROOT))
    from specdec_core.engine.config import default_cache_dir  # type: ignore
    from specdec_core.execution.device_profile import DeviceProfile  # type: ignore
    from specdec_core.loading.loader import load_model  # type: ignore

    mode = DeviceProfile.decide(args.device, args.dtype, args.quantize).kernels
    profile = DeviceProfile.decide(args.device, args.dtype, "none")
    log("baselines load their models through specdec_core.loading.loader.load_model (converted-weights cache)")

    def load(source: str | None, role: str):
        lm = load_model(source, role=role, profile=profile, cache_dir=default_cache_dir(), progress=True)
        return _dynamic_int8(lm.model) if mode in ("int8", "gguf") else lm.model, lm.tokenizer

    target, tok = load(args.model, "target")
    draft = None
    if need_draft:
        if args.model is None or args.draft_model:
            draft, _ = load(args.draft_model, "draft")
    return target, draft, tok, profile.device.type


def _dynamic_int8(model):
    """transformers has no per-row int8; torch's dynamic int8 is what a transformers user would run."""
    import torch

    return torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)


def run_baselines(args, workloads: dict[str, list[Workload]]) -> tuple[list[Row], list[dict], list[str]]:
    import torch
    from transformers import GenerationConfig
    from transformers.generation.streamers import BaseStreamer

    notes: list[str] = []
    wanted = list(args.baselines)
    need_draft = "hf_assisted" in wanted
    log(f"loading models for the transformers baselines ({', '.join(wanted)})")
    target, draft, tok, device = _load_pair(args, need_draft)
    if "hf_assisted" in wanted and draft is None:
        wanted.remove("hf_assisted")
        notes.append("hf_assisted skipped: no draft model (pass --draft-model)")
    k = args.num_speculative_tokens or 4

    class Timer(BaseStreamer):
        def __init__(self, start: float) -> None:
            self.start = start
            self.times: list[float] = []
            self.counts: list[int] = []
            self.prompt_seen = False

        def put(self, value) -> None:
            if not self.prompt_seen:  # generate() first hands over the prompt
                self.prompt_seen = True
                return
            self.times.append(time.perf_counter() - self.start)
            self.counts.append(int(value.numel()))

        def end(self) -> None:
            pass

    # Stop on the ids the server stops on (same rule, same function): otherwise the runs differ in length.
    from specdec_core.decoding.eos import eos_token_ids  # _load_pair put the repository root on sys.path

    eos = sorted(eos_token_ids(target, tok)) or None
    pad = tok.pad_token_id if tok.pad_token_id is not None else (eos[0] if eos else 0)
    rows: list[Row] = []
    details: list[dict] = []
    def extra_for(name: str) -> dict[str, Any]:
        if name == "hf_assisted":
            return {"assistant_model": draft}
        if name == "hf_prompt_lookup":
            return {"prompt_lookup_num_tokens": k}
        return {}

    for name in wanted:
        # Untimed warm-up, as for the servers: first-call costs stay out of the numbers.
        warm = {kk: v.to(device) for kk, v in tok("Hello, my name is", return_tensors="pt").items()}
        with torch.inference_mode():
            target.generate(**warm, generation_config=GenerationConfig(
                max_new_tokens=4, do_sample=False, eos_token_id=eos, pad_token_id=pad,
                temperature=None, top_p=None, top_k=None), **extra_for(name))
        for kind, wls in workloads.items():
            if kind == "agentic":  # sessions build each turn from the server's answers: servers only
                continue
            results: list[RequestResult] = []
            bar = progress(len(wls), f"{name:>16} {kind:<9} c=1")
            t0 = time.perf_counter()
            for wl in wls:
                if kind == "chat":
                    text = tok.apply_chat_template(wl.prompt, tokenize=False, add_generation_prompt=True)
                    enc = tok(text, return_tensors="pt", add_special_tokens=False)
                else:
                    enc = tok(wl.prompt, return_tensors="pt")
                enc = {kk: v.to(device) for kk, v in enc.items()}
                gen = GenerationConfig(
                    max_new_tokens=args.max_tokens, eos_token_id=eos, pad_token_id=pad,
                    do_sample=args.temperature > 0, temperature=args.temperature if args.temperature > 0 else None,
                    top_p=None, top_k=None,
                )
                extra = extra_for(name)
                if args.temperature > 0:
                    torch.manual_seed(args.seed + wl.index)
                start = time.perf_counter()
                timer = Timer(start)
                res = RequestResult(kind, wl.index)
                try:
                    with torch.inference_mode():
                        out = target.generate(**enc, generation_config=gen, streamer=timer, **extra)
                    new = out[0, enc["input_ids"].shape[1]:].tolist()
                    res.ok = True
                    res.completion_tokens = len(new)
                    res.prompt_tokens = int(enc["input_ids"].shape[1])
                    res.text = tok.decode(new, skip_special_tokens=True)
                    res.chunk_times = timer.times
                    res.ttft = timer.times[0] if timer.times else None
                    if name != "hf":
                        res.speculative = None  # transformers does not report acceptance per request
                except Exception as exc:  # noqa: BLE001 - a baseline failure is reported, not fatal
                    res.error = f"{type(exc).__name__}: {exc}"
                res.latency = time.perf_counter() - start
                results.append(res)
                bar.update(1)
            duration = time.perf_counter() - t0
            bar.close()
            row = summarize(name, kind, 1, results, duration)
            rows.append(row)
            log(f"{name} {kind} c=1: {row.output_tok_s:.2f} tok/s, TTFT p50 {fmt(row.ttft_p50_ms)} ms, "
                f"TPOT p50 {fmt(row.tpot_p50_ms)} ms")
            if row.failed:
                notes.append(f"{name} {kind}: {row.failed} failures: {row.errors}")
            for r in results:
                d = asdict(r)
                d.update(mode=name, concurrency=1)
                details.append(d)
    if args.temperature == 0:
        notes.append("baseline ITL/TPOT: hf streams one token per step; hf_assisted/hf_prompt_lookup stream "
                     "each accepted run as one chunk")
    return rows, details, notes
