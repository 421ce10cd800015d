"""Hand a loaded model's linear layers the GGUF blocks loading found for them.

For ``--quantize gguf`` the runner gives each ``nn.Linear`` (and a file-served model's
embedding) its blocks (``ATTRIBUTE``) while it prepares the layers, and ``block_linear`` turns
them into the block layer. Where the blocks come from is loading's business, handed over on the
model, so that execution never reads a file:

- a model served straight from its file (``loading/gguf_model``) carries its blocks already
  (``BLOCKS_ATTRIBUTE``, the embedding's too); its own weights are empty placeholders;
- a model loaded from the fp32 directory a GGUF file was converted into carries a reader
  (``BLOCK_READER_ATTRIBUTE``, ``loading/converted_blocks``), called here only when the model is
  prepared for the block kernels.
"""

from __future__ import annotations

import torch

from specdec_core.execution.gguf_linear import BlockWeight, GGUFLinear
from specdec_core.execution.hf_types import HFModule

ATTRIBUTE = "gguf_blocks"  # set on each nn.Linear that has executable blocks, while preparing
BLOCKS_ATTRIBUTE = "specdec_blocks"  # a model served from its file: module name -> its blocks
# a model converted from a GGUF file: model -> {module name: its blocks}, read from the file when called
BLOCK_READER_ATTRIBUTE = "specdec_block_reader"


def attach_block_weights(model: torch.nn.Module) -> int:
    """Give each ``nn.Linear`` of ``model`` (and a file-served model's embedding) its GGUF blocks
    (``ATTRIBUTE``); returns how many got them (0 for a model that does not come from a GGUF file)."""
    weights = getattr(model, BLOCKS_ATTRIBUTE, None)
    if weights is None:
        reader = getattr(model, BLOCK_READER_ATTRIBUTE, None)
        weights = reader(model) if reader is not None else {}
    for name, weight in weights.items():
        module = model.get_submodule(name)
        _check_dimensions(name, module, weight)
        setattr(module, ATTRIBUTE, weight)
    return len(weights)


def _check_dimensions(name: str, module: torch.nn.Module, weight: BlockWeight) -> None:
    """Refuse blocks whose dimensions are not the module's: the kernels take a weight's row length
    from its blocks and read that many activations, so a wrong one would read past them. Loading
    checks every tensor against its module already (``loading/gguf_shapes``); this is the last
    line before the kernels, for blocks from anywhere else."""
    if isinstance(module, torch.nn.Embedding):
        wanted = (module.num_embeddings, module.embedding_dim)
    elif isinstance(module, torch.nn.Linear):
        wanted = (module.out_features, module.in_features)
    else:
        return
    if (weight.out_features, weight.in_features) != wanted:
        raise ValueError(f"the blocks for {name} are [{weight.out_features}, {weight.in_features}] (rows, "
                         f"row length); the module is {list(wanted)}")


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
