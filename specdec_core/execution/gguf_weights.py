"""Find a loaded model's GGUF file and hand its linear layers the file's own blocks.

A GGUF model is loaded from its converted fp32 directory (``loader.convert_gguf``), which records
the source file in ``specdec_conversion.json``. For ``--quantize gguf`` the runner asks this
module for the blocks of every ``nn.Linear``: the GGUF tensor of the same name (the name map
``transformers`` uses, from the ``gguf`` package), its rows permuted exactly as transformers
permutes a llama GGUF's q/k projections (the file stores them interleaved for llama.cpp's RoPE),
and a tied output head served from the token embedding's blocks. Rows of blocks are
self-contained, so a row permutation or selection is exact.

A model served straight from its file (``loading.gguf_model``) carries its blocks already
(``BLOCKS_ATTRIBUTE``, the embedding's too); its own weights are empty placeholders.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from specdec_core.execution.gguf_file import read_gguf
from specdec_core.execution.gguf_linear import BlockWeight, GGUFLinear, executable
from specdec_core.execution.hf_types import HFModule
from specdec_core.kernels.c_library import SUPPORTED_TYPES

logger = logging.getLogger(__name__)

ATTRIBUTE = "gguf_blocks"  # set on each nn.Linear that has executable blocks, while preparing
BLOCKS_ATTRIBUTE = "specdec_blocks"  # a model served from its file: module name -> its blocks


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


def unpermute_rows(blocks: torch.Tensor, heads: int) -> torch.Tensor:
    """transformers' ``_reverse_permute_weights`` applied to whole rows of blocks."""
    n = blocks.shape[0]
    index = torch.arange(n).reshape(heads, n // heads // 2, 2).transpose(1, 2).reshape(-1)
    return blocks.index_select(0, index)


def read_block_weights(path: Path, model: HFModule) -> dict[str, BlockWeight]:
    """Module name -> executable blocks, for every ``nn.Linear`` of ``model`` the file covers."""
    import gguf

    file = read_gguf(path)
    architecture, tensors = file.architecture, file.tensors
    cfg = model.config
    # the file's own architecture names its tensors (transformers' model_type may differ: gemma3_text)
    arch = next((a for a, name in gguf.MODEL_ARCH_NAMES.items() if name in (architecture, cfg.model_type)), None)
    if arch is None:
        return {}
    name_map = gguf.get_tensor_name_map(arch, cfg.num_hidden_layers)
    permuted = architecture == "llama"
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is model.get_input_embeddings().weight
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    found: dict[str, BlockWeight] = {}
    mismatched: list[str] = []
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        gguf_name = name_map.get_name(name)
        if gguf_name is None:
            continue  # a module the file's architecture does not name
        if module is head and tied:
            gguf_name = "token_embd"  # a tied head is the embedding (whatever else the file stores)
        entry = tensors.get(f"{gguf_name}.weight")
        if entry is None or entry.ggml_type not in SUPPORTED_TYPES:
            continue
        if entry.shape != (module.in_features, module.out_features):
            raise ValueError(f"{gguf_name}.weight has shape {list(entry.shape)}, {name} wants "
                             f"{[module.in_features, module.out_features]}")
        blocks = torch.from_numpy(file.read(f"{gguf_name}.weight"))
        if permuted and gguf_name.endswith((".attn_q", ".attn_k")):
            blocks = unpermute_rows(blocks, heads if gguf_name.endswith(".attn_q") else kv_heads)
        weight = BlockWeight(entry.ggml_type, blocks.contiguous(), module.in_features)
        if not executable(weight):
            continue
        if not _first_row_matches(weight, module.weight):
            mismatched.append(name)
            continue
        found[name] = weight
    if mismatched:
        logger.warning("%d linear layers of %s are not the tensors %s names for them (a model changed after "
                       "loading?), e.g. %s: they run as Q8_0 made at load", len(mismatched), cfg.model_type, path.name, mismatched[0])
    return found


def _first_row_matches(weight: BlockWeight, dense: torch.Tensor) -> bool:
    """Whether the blocks' first row dequantizes to the module's first weight row, as it does for
    a model converted from this file: a model whose layers were dropped or replaced after loading
    keeps the file's name but not its tensors, and must not be served the file's blocks."""
    row = weight.dequantize_rows(torch.tensor([0]))[0]
    return torch.equal(row, dense.detach()[0].float())


def attach_block_weights(model: torch.nn.Module) -> int:
    """Give each ``nn.Linear`` of ``model`` (and a file-served model's embedding) its GGUF blocks
    (``ATTRIBUTE``); returns how many got them (0 for a model that does not come from a GGUF file)."""
    weights = getattr(model, BLOCKS_ATTRIBUTE, None)
    if weights is None:
        source = gguf_source(model)
        weights = read_block_weights(source, model) if source is not None else {}
    for name, weight in weights.items():
        setattr(model.get_submodule(name), ATTRIBUTE, weight)
    return len(weights)


def drop_file_blocks(model: torch.nn.Module) -> None:
    """Leave a file-served model's blocks only on its modules (``ATTRIBUTE``), for a runner that owns
    the model: each layer's are then freed once it holds its repacked copy, instead of the file's
    layout being held beside every copy (1.6 GB for the default pair)."""
    if hasattr(model, BLOCKS_ATTRIBUTE):
        delattr(model, BLOCKS_ATTRIBUTE)


def detach_block_weights(model: torch.nn.Module) -> None:
    """Drop the attached blocks once the prepared layers hold their own (fused) copies."""
    for module in model.modules():
        if hasattr(module, ATTRIBUTE):
            delattr(module, ATTRIBUTE)


def block_linear(linears: list[HFModule], rows: torch.Tensor | None = None) -> GGUFLinear | None:
    """The block layer computing ``linears``' concatenated outputs (only ``rows`` of them, if given),
    or None when one of them has no executable blocks (the caller then prepares it as before)."""
    found = [getattr(lin, ATTRIBUTE, None) for lin in linears]
    parts: list[BlockWeight] = [p for p in found if p is not None]
    if len(parts) != len(found):
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


def prepare_block_linears(module: HFModule) -> None:
    """Replace every ``nn.Linear`` inside ``module`` that has executable blocks by its block layer,
    in place (the generic transformers path; ``prepare_linears`` then prepares the rest)."""
    for name, child in list(module.named_children()):
        if isinstance(child, torch.nn.Linear):
            blocks = block_linear([child])
            if blocks is not None:
                setattr(module, name, blocks)
        else:
            prepare_block_linears(child)
