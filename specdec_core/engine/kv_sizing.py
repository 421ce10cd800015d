"""How many KV blocks an engine gets, and how long a request may be.

The pool is sized from memory, not from ``max_num_seqs x max_model_len``: on CUDA from
``--gpu-memory-utilization`` (vLLM's name: the share of the device's memory the engine may fill,
weights included), on the CPU from ``--kv-cache-memory`` (default: a quarter of the memory
available when the engine starts, after the weights are loaded). A position costs the keys and
values of every layer of both models (``kv_bytes_per_token``). The pool never grows past what
every running place at full length would need (and admission's spare block each), and it must
hold one full-length request: a ``--max-model-len`` that does not fit is refused; the default
(the model's own context length) is lowered to what fits, and the log says so.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

import torch

from specdec_core.engine.config import EngineConfig
from specdec_core.execution.hf_types import HFModule
from specdec_core.execution.kv_cache import blocks_for, kv_bytes_per_token

log = logging.getLogger(__name__)

CPU_SHARE = 0.25  # of the memory available at start, for the KV pool when --kv-cache-memory is not given
FALLBACK_CONTEXT = 2048  # for a model whose config states no context length

_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 2**10, "kib": 2**10, "m": 2**20, "mb": 2**20, "mib": 2**20,
          "g": 2**30, "gb": 2**30, "gib": 2**30, "t": 2**40, "tb": 2**40, "tib": 2**40}


def parse_size(text: str) -> int:
    """Bytes in ``"8GiB"``, ``"512 MB"``, ``"1.5g"`` or ``"4096"`` (binary units: a GB is 2**30)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    if m is None or m.group(2).lower() not in _UNITS:
        raise ValueError(f"not a memory size: {text!r} (e.g. 8GiB, 512MiB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def model_context(model: HFModule) -> int | None:
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    value = getattr(cfg, "max_position_embeddings", None)
    return int(value) if value else None


@dataclass(frozen=True)
class KVSizing:
    num_blocks: int
    block_size: int
    max_model_len: int
    bytes_per_token: int

    def describe(self) -> str:
        tokens = self.num_blocks * self.block_size
        return (f"KV cache: {self.num_blocks} blocks of {self.block_size} tokens ({tokens} tokens, "
                f"{tokens * self.bytes_per_token / 2**30:.2f} GiB); max_model_len {self.max_model_len}")


def available_memory(device: torch.device, gpu_memory_utilization: float) -> int:
    """Bytes the KV pool may take when no ``--kv-cache-memory`` is given."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        budget = int(gpu_memory_utilization * total) - (total - free)
        if budget <= 0:
            raise ValueError(f"--gpu-memory-utilization {gpu_memory_utilization} leaves no memory for the KV cache: "
                             f"{(total - free) / 2**30:.1f} of {total / 2**30:.1f} GiB are in use after loading the models")
        return budget
    return int(CPU_SHARE * _mem_available())


def _mem_available() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import os

    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def size_kv(models: list[HFModule], block_size: int, max_num_seqs: int, lookahead: int,
            max_model_len: int | None, budget: int) -> KVSizing:
    """Blocks for ``budget`` bytes across ``models`` (target and draft); ``lookahead``: draft
    positions a step may write past a request's known tokens."""
    per_token = sum(kv_bytes_per_token(m) for m in models)
    contexts = [c for c in (model_context(m) for m in models) if c]
    max_len = max_model_len or (min(contexts) if contexts else FALLBACK_CONTEXT)
    per_request = blocks_for(max_len + lookahead, block_size)
    # Every place at full length, plus the block per running request admission keeps spare.
    num_blocks = min(budget // (per_token * block_size), max_num_seqs * (per_request + 1))
    if num_blocks < per_request:
        fits = num_blocks * block_size - lookahead
        if max_model_len is not None or fits < 2:
            raise ValueError(
                f"the KV cache holds {max(num_blocks, 0) * block_size} tokens ({budget / 2**30:.2f} GiB at "
                f"{per_token} bytes per token) but one request of --max-model-len {max_len} needs "
                f"{per_request * block_size}: raise --kv-cache-memory (CPU) or --gpu-memory-utilization (CUDA), "
                f"or lower --max-model-len")
        log.warning("max_model_len lowered from the model's %d to %d tokens: that is what the KV cache holds "
                    "(--kv-cache-memory / --gpu-memory-utilization)", max_len, fits)
        max_len = fits
    return KVSizing(num_blocks, block_size, max_len, per_token)


def size_for(config: EngineConfig, models: list[HFModule], device: torch.device, lookahead: int) -> KVSizing:
    """The pool an engine gets from its flags: ``--kv-cache-memory`` when given, else the device's
    budget. Called before the runners prepare their kernels, which with ``release_weights`` keep
    the memory the loaded weights take."""
    budget = (parse_size(config.kv_cache_memory) if config.kv_cache_memory is not None
              else available_memory(device, config.gpu_memory_utilization))
    return size_kv(models, config.block_size, config.max_num_seqs, lookahead, config.max_model_len, budget)
