"""Engine configuration: everything fixed for the lifetime of one engine."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from specdec_core.kernels.cache_paths import default_cache_dir

SpeculativeMethod = Literal["auto", "draft", "ngram", "suffix", "none"]


DEFAULT_BLOCK_SIZE = 16  # tokens per KV block (vLLM's default)


def _flag(help: str, *, group: str = "runtime", default_help: str | None = None, minimum: float | None = None,
          maximum: float | None = None) -> dict:
    """``field`` metadata that ``specdec serve`` turns into a flag (``server.cli_flags``).

    ``help`` is the --help text; ``default_help`` says what the default means where the value alone
    would not (``None`` = auto, a factory); ``minimum``/``maximum`` are checked when the flag is parsed, so a bad
    value fails with the flag's (or environment variable's) name. Choices come from ``Literal``.
    """
    meta: dict = {"help": help, "group": group}
    if default_help is not None:
        meta["default_help"] = default_help
    if minimum is not None:
        meta["minimum"] = minimum
    if maximum is not None:
        meta["maximum"] = maximum
    return meta


@dataclass
class EngineConfig:
    """How to build and run one engine.

    ``model`` / ``draft_model`` accept a local HF directory, a hub id present in the local HF cache,
    a ``.gguf`` file, or ``None`` for the embedded default pair (Qwen2.5-Coder 1.5B target, 0.5B
    draft). ``speculative_method=None`` picks ``draft`` when a draft model is available, else
    ``ngram``.

    Every field is also a ``specdec serve`` flag (``--max-num-seqs``, env ``SPECDEC_MAX_NUM_SEQS``)
    generated from its ``metadata``: a new field needs its help text here and nothing else.
    """

    model: str | None = field(default=None, metadata=_flag(
        "target model: a local Hugging Face directory, a hub id already in the local HF cache, or a .gguf file",
        group="models", default_help="the embedded Qwen2.5-Coder 1.5B / 0.5B pair"))
    draft_model: str | None = field(default=None, metadata=_flag(
        "draft model for --speculative-method draft (same forms as --model)", group="models"))
    speculative_method: SpeculativeMethod | None = field(default=None, metadata=_flag(
        "how tokens are proposed: 'auto' (per request and step, whichever of n-gram lookup, suffix lookup and the "
        "draft model (if one is given) pays most from measured costs and the request's acceptance), 'draft' (a draft model), 'ngram' "
        "(lookup in the request's own tokens), 'suffix' (suffix tries over the request's own tokens and recent "
        "requests' outputs) or 'none'",
        group="models", default_help="auto when a draft model is given or for the default pair, else ngram"))
    num_speculative_tokens: int = field(default=4, metadata=_flag(
        "most draft tokens verified per request and step, k (the speculation policy picks 0..k each step; "
        "requests may lower it)", group="models", minimum=0))
    # 32768: on the default pair, c=1, k=3, acceptance 0.601 -> 0.574 and draft time per step
    # 61.3 -> 53.1 ms, +6% tokens/s (clients/tools/draft_vocab_sweep.py); 16384 loses (acceptance 0.456).
    draft_vocab_size: int = field(default=32768, metadata=_flag(
        "score only the N most frequent tokens in the draft model's head (lowest BPE ids plus special tokens; "
        "FR-Spec); cheaper drafts, still lossless, some acceptance lost; 0 = the whole vocabulary",
        group="models", minimum=0))
    device: Literal["auto", "cpu", "cuda"] = field(default="auto", metadata=_flag("where both models run"))
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = field(default="auto", metadata=_flag(
        "weight/activation dtype"))
    # "auto": on the CPU the block kernels where a vector set (AVX2, AVX-512 VNNI) runs (a GGUF
    # model's own blocks, Q8_0 made at load for any other model: per-row int8 garbles small models),
    # else per-row int8 (all batch-invariant); none (bf16) on CUDA.
    quantize: Literal["auto", "none", "int8", "gguf"] = field(default="auto", metadata=_flag(
        "linear layers: gguf (the GGUF block kernels: a GGUF model's own quantized blocks, Q8_0 blocks made at "
        "load for any other model or layer; 8-bit per-row activations, batch-invariant; CPU only), "
        "int8 (opt-in: per-row activation and per-channel weight scales, batch-invariant, lower quality; CPU only), "
        "none (fp32 on CPU, bf16 on CUDA), auto = gguf on an AVX2, AVX-512 VNNI or AMX CPU, else int8 on CPU, none on CUDA"))
    # The C kernels' instruction set, for the process (``c_library``): auto takes the best this CPU runs.
    kernels: Literal["auto", "amx-int8", "avx512-vnni", "avx2", "portable"] = field(default="auto", metadata=_flag(
        "C kernel set (block GEMMs, row ops, row attention) for the whole process: amx-int8 (AVX-512 VNNI plus AMX tile "
        "products for steps of several rows; same bits), avx512-vnni, avx2, portable (plain C, any CPU; "
        "correct, not fast), auto = the best this CPU and OS support; the start-up line names it and the CPU's features"))
    # "segments" keeps every row bit-identical alone and batched (the CPU's promise); "packed" is
    # one attention call per layer for the whole step (what a launch-bound GPU needs).
    attention: Literal["auto", "segments", "packed"] = field(default="auto", metadata=_flag(
        "attention layout of the Llama-family forward: segments (one call per KV block of a request's known tokens and per "
        "draft; rows bit-identical alone and batched), packed (one call per layer for the whole step; rows equal "
        "up to rounding), auto = segments on CPU, packed on CUDA"))
    # On a GPU a decode step is bound by kernel launches: replaying a captured graph costs one.
    decode_graphs: Literal["auto", "on", "off"] = field(default="auto", metadata=_flag(
        "run decode, verification and draft-position forwards in bucketed static shapes (requests padded to "
        "1/2/4/8/16/24/..., queries to 1 or 1 + k, keys to a power of two), captured as CUDA graphs per bucket (at start-up up to "
        "--graph-capture-len keys, the rest on first use) and replayed "
        "(vLLM's --enforce-eager is 'off'); needs packed attention and a Llama-family model; on the CPU 'on' runs "
        "the same shapes eagerly (slower: for checking them); auto = on with CUDA, off on the CPU"))
    graph_capture_len: int = field(default=4096, metadata=_flag(
        "with decode graphs on CUDA: capture every bucket whose keys fit this many tokens at start-up, so that no "
        "request's step pays for a capture (vLLM's max_seq_len_to_capture); longer forwards are captured on first "
        "use; 0 = all on first use", minimum=0))
    max_num_seqs: int = field(default=8, metadata=_flag("requests decoded together in one batch", minimum=1))
    # None: the model's own context length (max_position_embeddings), lowered to what the KV pool
    # holds; the engine writes the value it runs with back here (``kv_sizing``).
    max_model_len: int | None = field(default=None, metadata=_flag(
        "prompt + completion tokens per request", minimum=2,
        default_help="the model's own context length, or what the KV cache holds if that is less"))
    # The KV pool: fixed-size blocks handed out as requests grow (``execution.kv_cache``).
    block_size: int = field(default=DEFAULT_BLOCK_SIZE, metadata=_flag(
        f"tokens per KV cache block; must divide --prefill-chunk-size (the default {DEFAULT_BLOCK_SIZE} is "
        "lowered to a divisor of it)", minimum=1))
    kv_cache_memory: str | None = field(default=None, metadata=_flag(
        "memory for the KV cache of both models, e.g. 8GiB or 512MiB (CPU; on CUDA it overrides "
        "--gpu-memory-utilization)", default_help="a quarter of the memory available at start on the CPU"))
    gpu_memory_utilization: float = field(default=0.9, metadata=_flag(
        "share of the GPU's memory the engine may fill, weights included; the KV cache gets what the loaded "
        "models leave of it (CUDA)", minimum=0.01, maximum=1.0))
    # Prompt tokens prefilled per step. Prompts are cut into chunks of this size at fixed offsets
    # (0, C, 2C, ...), so how a prompt is chunked never depends on what else is running. (Not
    # vLLM's --max-num-batched-tokens, a budget for all tokens of a step: hence another name.)
    prefill_chunk_size: int = field(default=512, metadata=_flag(
        "prompt tokens prefilled per engine step (long prompts are prefilled in chunks of this size)", minimum=1))
    # Full prompt blocks stay in the pool after their request finishes until they are handed out
    # again; a request whose prompt starts with them skips their prefill (bit-identical logits:
    # see prefix_cache.py).
    enable_prefix_caching: bool = field(default=True, metadata=_flag(
        "reuse the cached keys/values of earlier prompts' full KV blocks for a prompt that starts with "
        "them (chat histories, agents resending files); the logits are those of a recompute"))
    ngram_min: int = field(default=1, metadata=_flag(
        "shortest suffix --speculative-method ngram looks up in the request's tokens", group="models", minimum=1))
    ngram_max: int = field(default=4, metadata=_flag(
        "longest suffix --speculative-method ngram looks up (tried first)", group="models", minimum=1))
    # Nodes <= tokens x depth, ~270 bytes each: 16384 x 24 -> at most ~105 MB, reached only by
    # text that never repeats (docs/speculation-and-execution.md#suffix-decoding).
    suffix_cache_tokens: int = field(default=16384, metadata=_flag(
        "tokens of recently finished requests' outputs kept in the global suffix trie (the oldest request's "
        "leave first); 0 = only each request's own text", group="models", minimum=0))
    suffix_depth: int = field(default=24, metadata=_flag(
        "depth of the suffix tries: matches use up to half of it, proposals the rest", group="models", minimum=4))
    suffix_trees: bool = field(default=True, metadata=_flag(
        "let the suffix method propose token trees (several likely continuations verified in one forward) "
        "where the trie branches; CPU segmented attention only", group="models"))
    seed: int | None = field(default=None, metadata=_flag(
        "engine seed for requests that give none", default_help="seeded from the clock at startup"))
    cache_dir: Path = field(default_factory=default_cache_dir, metadata=_flag(
        "where converted GGUF weights, the default pair's checked headers and the step costs are kept",
        default_help="$XDG_CACHE_HOME/specdec, i.e. ~/.cache/specdec"))
    # Choose each step's draft lengths from measured step costs and observed acceptance (never
    # above num_speculative_tokens). Changes speed only, never the output.
    adaptive_speculation: bool = field(default=True, metadata=_flag(
        "choose each step's draft lengths (0..--num-speculative-tokens) from step costs measured at start-up "
        "and observed acceptance (a lookup's by its evidence, the draft model's per request); off: always k "
        "drafts; changes speed only, never the output",
        group="models"))

    def __post_init__(self) -> None:
        if self.speculative_method not in (None, "auto", "draft", "ngram", "suffix", "none"):
            raise ValueError(f"unknown speculative_method {self.speculative_method!r}")
        if self.num_speculative_tokens < 0:
            raise ValueError("num_speculative_tokens must be >= 0")
        if self.max_num_seqs < 1 or (self.max_model_len is not None and self.max_model_len < 2) or self.prefill_chunk_size < 1:
            raise ValueError("max_num_seqs, max_model_len and prefill_chunk_size must be positive")
        if self.block_size == DEFAULT_BLOCK_SIZE:
            self.block_size = math.gcd(DEFAULT_BLOCK_SIZE, self.prefill_chunk_size)
        if self.block_size < 1 or self.prefill_chunk_size % self.block_size:
            raise ValueError(f"--prefill-chunk-size ({self.prefill_chunk_size}) must be a multiple of --block-size "
                             f"({self.block_size}): prompt chunks end on block boundaries")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError("gpu_memory_utilization must be in (0, 1]")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError("need 1 <= ngram_min <= ngram_max")
        self.cache_dir = Path(self.cache_dir)


def speculation_method(requested: str | None, draft_available: bool) -> str:
    """The method an engine runs: the one asked for, else ``auto`` with a draft model and
    ``ngram`` without; ``draft`` without a draft model is refused (``auto`` without one chooses
    among the lookups)."""
    method = requested or ("auto" if draft_available else "ngram")
    if method == "draft" and not draft_available:
        raise ValueError(f"speculative_method {method!r} needs a draft model (--draft-model)")
    return method
