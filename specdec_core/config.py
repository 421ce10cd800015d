"""Engine configuration: everything fixed for the lifetime of one engine."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

SpeculativeMethod = Literal["draft", "ngram", "none"]


def default_cache_dir() -> Path:
    """Where converted GGUF weights and the assembled default pair live (overridable by env)."""
    import os

    root = os.environ.get("SPECDEC_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "specdec"
    )
    return Path(root)


@dataclass
class EngineConfig:
    """How to build and run one engine.

    ``model`` / ``draft_model`` accept a local HF directory, a hub id present in the local HF cache,
    a ``.gguf`` file, or ``None`` for the embedded default pair (Qwen2.5-Coder 1.5B target, 0.5B
    draft). ``speculative_method=None`` picks ``draft`` when a draft model is available, else
    ``ngram``.
    """

    model: str | None = None
    draft_model: str | None = None
    speculative_method: SpeculativeMethod | None = None
    num_speculative_tokens: int = 4
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    # "auto": per-row int8 on the CPU (fast, batch-invariant), none (bf16) on CUDA.
    quantize: Literal["auto", "none", "int8"] = "auto"
    max_num_seqs: int = 8
    max_model_len: int = 2048
    # Prompt tokens prefilled per step. Prompts are cut into chunks of this size at fixed offsets
    # (0, C, 2C, ...), so how a prompt is chunked never depends on what else is running.
    max_num_batched_tokens: int = 512
    ngram_min: int = 1
    ngram_max: int = 4
    seed: int | None = None
    cache_dir: Path = field(default_factory=default_cache_dir)
    # Adapt the number of draft tokens per request to its observed acceptance (never above
    # num_speculative_tokens). Does not affect losslessness, only speed.
    adaptive_speculation: bool = True

    def __post_init__(self) -> None:
        if self.speculative_method not in (None, "draft", "ngram", "none"):
            raise ValueError(f"unknown speculative_method {self.speculative_method!r}")
        if self.num_speculative_tokens < 0:
            raise ValueError("num_speculative_tokens must be >= 0")
        if self.max_num_seqs < 1 or self.max_model_len < 2 or self.max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs, max_model_len and max_num_batched_tokens must be positive")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError("need 1 <= ngram_min <= ngram_max")
        self.cache_dir = Path(self.cache_dir)
