"""Find a loaded model's GGUF file and hand its linear layers the file's own blocks.

A GGUF model is loaded from its converted fp32 directory (``loader.convert_gguf``), which records
the source file in ``specdec_conversion.json``. For ``--quantize gguf`` the runner asks this
module for the blocks of every ``nn.Linear``: the GGUF tensor of the same name (the name map
``transformers`` uses, from the ``gguf`` package), its rows permuted exactly as transformers
permutes a llama GGUF's q/k projections (the file stores them interleaved for llama.cpp's RoPE),
and a tied output head served from the token embedding's blocks. Rows of blocks are
self-contained, so a row permutation or selection is exact.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import torch

from .gguf_kernels import SUPPORTED_TYPES
from .gguf_linear import BlockWeight, GGUFLinear, executable

logger = logging.getLogger(__name__)

ATTRIBUTE = "gguf_blocks"  # set on each nn.Linear that has executable blocks, while preparing


def gguf_source(model: torch.nn.Module) -> Path | None:
    """The GGUF file ``model`` was converted from, if it still is the file that was converted."""
    record = Path(str(getattr(model, "name_or_path", "") or "")) / "specdec_conversion.json"
    if not record.is_file():
        return None
    info = json.loads(record.read_text())
    source = Path(info.get("source", ""))
    if not source.is_file():
        return None
    stat = source.stat()
    if stat.st_size != info.get("size") or stat.st_mtime_ns != info.get("mtime_ns"):
        logger.warning("%s changed since it was converted; serving the converted weights", source)
        return None
    return source


def _field(reader, key: str) -> str | None:
    field = reader.fields.get(key)
    if field is None:
        return None
    return bytes(field.parts[field.data[0]]).decode()


def _unpermute(blocks: torch.Tensor, heads: int) -> torch.Tensor:
    """transformers' ``_reverse_permute_weights`` applied to whole rows of blocks."""
    n = blocks.shape[0]
    index = torch.arange(n).reshape(heads, n // heads // 2, 2).transpose(1, 2).reshape(-1)
    return blocks.index_select(0, index)


def read_block_weights(path: Path, model: torch.nn.Module) -> dict[str, BlockWeight]:
    """Module name -> executable blocks, for every ``nn.Linear`` of ``model`` the file covers."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    cfg = model.config
    arch = next((a for a, name in gguf.MODEL_ARCH_NAMES.items() if name == cfg.model_type), None)
    if arch is None:
        return {}
    name_map = gguf.get_tensor_name_map(arch, cfg.num_hidden_layers)
    tensors = {t.name: t for t in reader.tensors}
    permuted = _field(reader, "general.architecture") == "llama"
    head = model.get_output_embeddings()
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    found: dict[str, BlockWeight] = {}
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        gguf_name = name_map.get_name(name)
        if module is head and f"{gguf_name}.weight" not in tensors and getattr(cfg, "tie_word_embeddings", False):
            gguf_name = "token_embd"  # a tied head: the file stores only the embedding
        tensor = tensors.get(f"{gguf_name}.weight")
        if tensor is None or int(tensor.tensor_type) not in SUPPORTED_TYPES:
            continue
        blocks = torch.from_numpy(np.array(tensor.data, dtype=np.uint8, copy=True))
        if tuple(int(s) for s in tensor.shape) != (module.in_features, module.out_features):
            raise ValueError(f"{tensor.name} has shape {list(tensor.shape)}, {name} wants "
                             f"{[module.in_features, module.out_features]}")
        if permuted and gguf_name.endswith((".attn_q", ".attn_k")):
            blocks = _unpermute(blocks, heads if gguf_name.endswith(".attn_q") else kv_heads)
        weight = BlockWeight(int(tensor.tensor_type), blocks.contiguous(), module.in_features)
        if executable(weight):
            found[name] = weight
    return found


def attach_block_weights(model: torch.nn.Module) -> int:
    """Give each ``nn.Linear`` of ``model`` its GGUF blocks (``ATTRIBUTE``); returns how many got
    them (0 for a model that does not come from a GGUF file)."""
    source = gguf_source(model)
    if source is None:
        return 0
    weights = read_block_weights(source, model)
    for name, weight in weights.items():
        setattr(model.get_submodule(name), ATTRIBUTE, weight)
    return len(weights)


def detach_block_weights(model: torch.nn.Module) -> None:
    """Drop the attached blocks once the prepared layers hold their own (fused) copies."""
    for module in model.modules():
        if hasattr(module, ATTRIBUTE):
            delattr(module, ATTRIBUTE)


def block_linear(linears: list[torch.nn.Module], rows: torch.Tensor | None = None) -> GGUFLinear | None:
    """The block layer computing ``linears``' concatenated outputs (only ``rows`` of them, if given),
    or None when one of them has no executable blocks (the caller then prepares it as before)."""
    parts = [getattr(lin, ATTRIBUTE, None) for lin in linears]
    if any(p is None for p in parts):
        return None
    if rows is not None:
        if len(parts) != 1:
            raise ValueError("a row selection applies to one linear")
        parts = [parts[0].rows(rows)]
    biases = [getattr(lin, "bias", None) for lin in linears]
    if rows is not None and biases[0] is not None:
        biases = [biases[0].detach()[rows]]
    bias = None
    if any(b is not None for b in biases):
        bias = torch.cat([b.detach().float() if b is not None else torch.zeros(p.out_features)
                          for b, p in zip(biases, parts)])
    return GGUFLinear(parts, bias)
