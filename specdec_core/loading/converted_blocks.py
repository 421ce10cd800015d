"""The GGUF blocks of a model loaded from the fp32 directory it was converted into.

A GGUF model that ``gguf_model`` does not serve from its file (an architecture it does not
read, or a profile that is not ``--quantize gguf``) is loaded from its converted fp32 directory
(``loader.convert_gguf``), which records the source file in ``specdec_conversion.json``. For
``--quantize gguf`` each ``nn.Linear`` of such a model is then served the file's own blocks: the
GGUF tensor of the same name (the name map ``transformers`` uses, from the ``gguf`` package), its
rows permuted exactly as transformers permutes a llama GGUF's q/k projections (the file stores
them interleaved for llama.cpp's RoPE), and a tied output head served from the token embedding's
blocks. Rows of blocks are self-contained, so a row permutation or selection is exact.

Why here and not in execution: reading the file is loading's work, and execution, below loading,
may not import the file reader. The loader gives such a model ``read_file_blocks``
(``offer_file_blocks``); the runner calls it only when it prepares the model for the block
kernels (``execution/gguf_weights.attach_block_weights``), so a model loaded once and run in
another mode reads nothing, and the blocks are dropped once the layers hold their own copies.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from specdec_core.execution.gguf_linear import BlockWeight, executable
from specdec_core.execution.gguf_weights import BLOCK_READER_ATTRIBUTE
from specdec_core.execution.hf_types import HFModule
from specdec_core.kernels.c_library import SUPPORTED_TYPES
from specdec_core.loading.gguf_file import read_gguf
from specdec_core.loading.model_errors import ModelFileError

logger = logging.getLogger(__name__)

RECORD = "specdec_conversion.json"  # written by ``loader.convert_gguf`` beside the converted weights


def offer_file_blocks(model: torch.nn.Module, path: Path) -> None:
    """Let a runner read the blocks of ``model``, loaded from directory ``path``, from the GGUF
    file it was converted from (when ``path`` is such a conversion)."""
    if (path / RECORD).is_file():
        setattr(model, BLOCK_READER_ATTRIBUTE, read_file_blocks)


def read_file_blocks(model: HFModule) -> dict[str, BlockWeight]:
    """Module name -> executable blocks of ``model`` from its source file; none when the file is
    gone or changed since the conversion."""
    source = gguf_source(model)
    return read_block_weights(source, model) if source is not None else {}


def gguf_source(model: torch.nn.Module) -> Path | None:
    """The GGUF file ``model`` was converted from, if it still is the file that was converted."""
    record = Path(str(getattr(model, "name_or_path", "") or "")) / RECORD
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
    """transformers' ``_reverse_permute_weights`` applied to whole rows of blocks (also for the
    models ``gguf_model`` serves from their file)."""
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
        if entry.shape != (module.in_features, module.out_features):  # the kernels trust the row length
            raise ModelFileError(path.name, f"{gguf_name}.weight dimensions", f"{[module.in_features, module.out_features]} "
                                 f"for {name}", list(entry.shape))
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
